"""Cubicle's accessibility tree as the XML OSWorld's guest server writes for Ubuntu.

Each element is named after its AT-SPI role ("push button" → `<push-button>`), carries
`name`, a `st:<state>="true"` attribute per state, its box as `cp:screencoord="(x, y)"`
and `cp:size="(w, h)"`, and its text (when it has some) as content. OSWorld's
`check_accessibility_tree` selects in it with XPath or CSS under the same namespaces.
"""

from __future__ import annotations

import re
from xml.etree import ElementTree

from cubicle import A11yNode, A11yTree

NAMESPACES = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
"""OSWorld's namespaces for Ubuntu (`desktop_env.evaluators.metrics.general`)."""

_NOT_A_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def _tag(role: str) -> str:
    tag = _NOT_A_NAME.sub("-", role.strip().replace(" ", "-")) or "unknown"
    return tag if tag[0].isalpha() else f"x-{tag}"


def _element(node: A11yNode) -> ElementTree.Element:
    element = ElementTree.Element(_tag(node.role), {"name": node.name})
    if node.description:
        element.set("description", node.description)
    for state in node.states:
        element.set(f"{{{NAMESPACES['st']}}}{_tag(state)}", "true")
    if node.x is not None and node.y is not None:
        element.set(f"{{{NAMESPACES['cp']}}}screencoord", f"({node.x}, {node.y})")
        element.set(f"{{{NAMESPACES['cp']}}}size", f"({node.width}, {node.height})")
    if node.text:
        element.text = node.text
    for child in node.children:
        element.append(_element(child))
    return element


def tree_to_xml(tree: A11yTree) -> str:
    """The tree as one XML document rooted at `<desktop-frame>`."""
    for prefix, uri in NAMESPACES.items():  # so the text reads `st:focused`, as OSWorld's
        ElementTree.register_namespace(prefix, uri)
    root = ElementTree.Element("desktop-frame", {"name": "main"})
    for node in tree.nodes:
        root.append(_element(node))
    return ElementTree.tostring(root, encoding="unicode")
