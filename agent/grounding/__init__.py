"""Grounders: a description of an on-screen element in, a point in screen pixels out."""

from agent.grounding.a11y import A11yGrounder
from agent.grounding.base import Grounder, GroundingResult
from agent.grounding.chain import GrounderChain, build_grounders
from agent.grounding.families import FAMILIES, Family, get_family
from agent.grounding.ocr import OcrGrounder
from agent.grounding.resize import smart_resize
from agent.grounding.vlm import VlmGrounder

__all__ = [
    "FAMILIES",
    "A11yGrounder",
    "Family",
    "Grounder",
    "GrounderChain",
    "GroundingResult",
    "OcrGrounder",
    "VlmGrounder",
    "build_grounders",
    "get_family",
    "smart_resize",
]
