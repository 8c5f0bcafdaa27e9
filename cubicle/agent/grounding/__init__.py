"""Grounders: a description of an on-screen element in, a point in screen pixels out."""

from cubicle.agent.grounding.a11y import A11yGrounder
from cubicle.agent.grounding.base import Grounder, GroundingResult
from cubicle.agent.grounding.chain import GrounderChain, build_grounders
from cubicle.agent.grounding.families import FAMILIES, Family, get_family
from cubicle.agent.grounding.ocr import OcrGrounder
from cubicle.agent.grounding.resize import smart_resize
from cubicle.agent.grounding.vlm import VlmGrounder

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
