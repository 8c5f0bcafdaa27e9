"""The accessibility tree as compact text, for models and people to read."""

from __future__ import annotations

from cubicle.protocol.models import A11yNode, A11yTree

_A11Y_SHOWN = {"focused", "checked", "selected", "pressed", "expanded"}


def a11y_text(tree: A11yTree, *, max_lines: int = 150) -> str:
    """The accessibility tree as short indented lines, `role "name" (states)`, keeping only
    elements that show on screen and have a name or text; at most `max_lines` lines."""
    lines: list[str] = []

    def visit(node: A11yNode, depth: int) -> None:
        if len(lines) >= max_lines:
            return
        showing = node.x is None or "showing" in node.states
        if not showing:
            return
        label = node.name or (node.text or "")
        shown = depth
        if node.role == "application" or label:
            states = sorted(_A11Y_SHOWN.intersection(node.states))
            extra = f" ({', '.join(states)})" if states else ""
            lines.append(f"{'  ' * depth}{node.role} {label[:80]!r}{extra}")
            shown = depth + 1
        for child in node.children:
            visit(child, shown)

    for application in tree.nodes:
        if application.children:
            visit(application, 0)
    if len(lines) >= max_lines or tree.truncated:
        lines.append("… (more elements not shown)")
    return "\n".join(lines)
