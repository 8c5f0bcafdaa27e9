"""Grounders: a description of an on-screen element in, a point in screen pixels out."""

from agent.grounding.base import Grounder, GroundingResult
from agent.grounding.families import FAMILIES, Family, get_family
from agent.grounding.resize import smart_resize
from agent.grounding.vlm import VlmGrounder

__all__ = [
    "FAMILIES",
    "Family",
    "Grounder",
    "GroundingResult",
    "VlmGrounder",
    "get_family",
    "smart_resize",
]
