"""`A11yGrounder`: find the described element in the accessibility tree (AT-SPI), no model.

The description is parsed into a name, an optional role word and an optional context
(`parse_description`): "the Save button in the dialog" → name "Save", roles {push button,
toggle button…}, context "dialog". Every showing element of the tree fetched through the SDK
is scored against it:

- name: exact (1.0) > the name starts with it (0.85) > contains it as whole words (0.7) >
  near-miss spelling or shared words (up to 0.8); an exact match of the element's
  description (tooltip) counts 0.7. Names compare case-insensitively, without the trailing
  "…" or ":" and invisible marks.
- +0.2 when the role matches the role word, −0.3 when a role word was given and does not
  match; +0.1 inside the active window; +0.15 when the context names an ancestor
  ("in the Save As dialog", "in Thunar").
- "the Name field": a label that matches stands for the nearest editable sibling.

An element wholly hidden by the active window (which the window manager keeps on top) or by
an open menu is left out; a partly hidden one is aimed at through its largest visible part,
clipped to the screen. Ties go to the smaller element, then to tree order. Below `MIN_SCORE`: None.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from PIL import Image

from cubicle.agent.grounding.base import Grounder, GroundingResult
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol.models import A11yNode, A11yTree

MIN_SCORE = 0.7
"""Lowest total score of an element that is returned."""
MIN_NAME_SCORE = 0.5
"""Lowest name score of an element that is considered at all."""

Box = tuple[int, int, int, int]
"""(left, top, right, bottom) in screen pixels, right and bottom exclusive."""

_TEXT_ENTRY = frozenset({"text", "password text", "entry", "editbar", "spin button"})
_BUTTONS = frozenset({"push button", "toggle button", "radio button", "menu button", "button"})
_MENU_ITEMS = frozenset({"menu item", "check menu item", "radio menu item", "menu"})
_LIST_ITEMS = frozenset({"list item", "table cell", "tree item"})
_WINDOWS = frozenset({"frame", "window", "dialog", "file chooser", "alert"})
# fmt: off
_ROLE_TABLE: tuple[tuple[tuple[str, ...], frozenset[str]], ...] = (
    (("button", "btn"), _BUTTONS),
    (("push button",), frozenset({"push button"})),
    (("toggle button",), frozenset({"toggle button"})),
    (("radio button", "radio"), frozenset({"radio button", "radio menu item"})),
    (("option",), frozenset({"radio button", "radio menu item", "list item", "menu item"})),
    (("menu", "submenu"), frozenset({"menu", "menu item"})),
    (("menu item", "menu entry", "menu option"), _MENU_ITEMS),
    (("item",), _MENU_ITEMS | _LIST_ITEMS | {"icon"}),
    (("list item",), _LIST_ITEMS),
    (("field", "text field", "text box", "textbox", "box", "entry", "input", "input field",
      "text input", "text entry", "search box", "search field", "text area", "edit box",
      "textarea"), _TEXT_ENTRY),
    (("password field",), frozenset({"password text"})),
    (("checkbox", "check box", "check"), frozenset({"check box", "check menu item"})),
    (("tab", "page tab"), frozenset({"page tab"})),
    (("link", "hyperlink"), frozenset({"link"})),
    (("icon", "image"), frozenset({"icon", "image"}) | _BUTTONS),
    (("label", "heading", "caption"), frozenset({"label", "heading", "static"})),
    (("combo box", "combobox", "dropdown", "drop-down", "drop down", "select"),
     frozenset({"combo box"})),
    (("cell", "table cell"), frozenset({"table cell"})),
    (("row",), frozenset({"table row", "table cell", "list item"})),
    (("column header", "header", "column"), frozenset({"table column header", "column header"})),
    (("toolbar", "tool bar"), frozenset({"tool bar"})),
    (("menu bar", "menubar"), frozenset({"menu bar"})),
    (("status bar", "statusbar"), frozenset({"status bar"})),
    (("scroll bar", "scrollbar"), frozenset({"scroll bar"})),
    (("slider",), frozenset({"slider"})),
    (("spin button", "spinner", "spin box"), frozenset({"spin button"})),
    (("tree item", "node"), frozenset({"tree item", "table cell"})),
    (("pane", "panel", "sidebar", "side bar"),
     frozenset({"scroll pane", "panel", "split pane", "directory pane", "viewport"})),
    (("window", "dialog", "dialog box"), _WINDOWS),
    (("terminal",), frozenset({"terminal"})),
    (("progress bar",), frozenset({"progress bar"})),
)
_ATSPI_ROLES = (
    "filler", "table", "page tab list", "scroll pane", "split pane", "viewport", "frame",
    "directory pane", "file chooser", "table column header", "table row", "tree table",
    "list box", "list", "tree", "separator", "canvas", "drawing area", "document frame",
    "paragraph", "section", "alert", "notification", "text", "entry", "password text",
    "check menu item", "radio menu item", "tool tip", "tree item", "menu button",
)
# fmt: on
_ROLE_WORDS = {role: frozenset({role}) for role in _ATSPI_ROLES} | {
    word: roles for words, roles in _ROLE_TABLE for word in words
}
"""Role words a description may use → the AT-SPI roles they stand for; AT-SPI role names
themselves (as `as_text` shows them) stand for their own role."""
_ROLE_PATTERN = re.compile(
    r"(?:^|\s)(" + "|".join(sorted(map(re.escape, _ROLE_WORDS), key=len, reverse=True)) + r")$",
    re.IGNORECASE,
)
_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”|‘([^’]+)’|(?<!\w)\'([^\']+)\'(?!\w)')
_LABELLED = re.compile(
    r"\s*\b(?:labell?ed|named|called|titled|captioned|that says|saying|reading"
    r"|with (?:the )?(?:label|text|name|title|caption))\s+",
    re.IGNORECASE,
)
_CONTEXT = re.compile(
    r"\s+(?:in|on|inside|within|of|at|from|under|near|next to|beside|below|above"
    r"|to the (?:left|right) of)\s+(?:the|a|an|this|that|its)\s+",
    re.IGNORECASE,
)
_APP_CONTEXT = re.compile(r"\s+(?:in|of)\s+([A-Z][\w.-]*)$")
""""the File menu in Thunar": an application named right after "in"."""
_LEADING = re.compile(
    r"^(?:(?:click|double-click|right-click|press|select|choose|tap|hit|open|focus)"
    r"(?:\s+on)?\s+(?=(?:the|a|an)\s))?(?:(?:the|a|an)\s+)?",
    re.IGNORECASE,
)
_TRAILING_MARKS = re.compile(r"(?:\.\.\.|[:.…])+$")


@dataclass(frozen=True, slots=True)
class Description:
    """What a description of an element says, as `parse_description` reads it."""

    name: str
    """The element's name or visible text ("Save"); empty when the description gives none."""
    role_word: str | None
    """The role word used ("button", "menu", "field"…), lower-case; None when there is none."""
    roles: frozenset[str]
    """AT-SPI role names the role word stands for; empty when there is no role word."""
    context: str
    """What the element lies in ("Save As dialog", "Thunar"); empty when not said."""


def parse_description(description: str) -> Description:
    """Read a name, a role word and a context out of `description`.

    Quoted text is the name ("the 'Save' button"); so is what follows "labelled", "named",
    "called"…; otherwise the name is the description without its leading verb and article,
    its trailing role word and its "in the …" context.
    """
    text = " ".join(description.split()).rstrip(".!?")
    quoted = _QUOTED.search(text)
    if quoted:
        name = next(group for group in quoted.groups() if group is not None).strip()
        head = text[: quoted.start()].strip()
        tail = text[quoted.end() :].strip()
        role_word = _role_word(head) or _role_word(_split_context(tail)[0])
        return _described(name, role_word, _split_context(" " + tail)[1])
    labelled = _LABELLED.search(text)
    if labelled:
        name, context = _split_context(text[labelled.end() :])
        return _described(name, _role_word(text[: labelled.start()]), context)
    main, context = _split_context(text)
    main = _LEADING.sub("", main, count=1)
    role = _ROLE_PATTERN.search(main)
    if role and role.start() > 0:
        return _described(main[: role.start()], role.group(1), context)
    return _described(main, None, context)


def _described(name: str, role_word: str | None, context: str) -> Description:
    word = role_word.lower() if role_word else None
    roles = _ROLE_WORDS.get(word, frozenset()) if word else frozenset()
    return Description(_LEADING.sub("", name.strip(), count=1), word, roles, context.strip())


def _role_word(text: str) -> str | None:
    """The role word `text` ends with ("the text field" → "text field")."""
    match = _ROLE_PATTERN.search(text.strip())
    return match.group(1) if match else None


def _split_context(text: str) -> tuple[str, str]:
    """("Save button", "Save As dialog") from "Save button in the Save As dialog"."""
    match = _CONTEXT.search(text) or _APP_CONTEXT.search(text)
    if match is None:
        return text.strip(), ""
    context = match.group(1) if match.re is _APP_CONTEXT else text[match.end() :]
    return text[: match.start()].strip(), context


def normalise(name: str) -> str:
    """`name` compared case-insensitively: NFKC, no invisible marks, no trailing "…"/":",
    single spaces."""
    text = unicodedata.normalize("NFKC", name)
    text = "".join(char for char in text if unicodedata.category(char) != "Cf")
    return _TRAILING_MARKS.sub("", " ".join(text.split()).casefold()).strip()


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def name_score(wanted: str, name: str) -> float:
    """How well an element's `name` matches the `wanted` one (both `normalise`d), 0 to 1."""
    if not wanted or not name:
        return 0.0
    if wanted == name:
        return 1.0
    padded_name, padded_wanted = f" {' '.join(_words(name))} ", f" {' '.join(_words(wanted))} "
    if padded_name.startswith(padded_wanted):
        return 0.85
    if padded_wanted in padded_name:
        return 0.7
    spelling = difflib.SequenceMatcher(None, wanted, name).ratio()
    wanted_words, name_words = set(_words(wanted)), set(_words(name))
    overlap = len(wanted_words & name_words) / len(wanted_words | name_words or {""})
    return max(0.9 * spelling if spelling >= 0.85 else 0.0, 0.8 * overlap)


@dataclass(frozen=True, slots=True)
class _Placed:
    """A node with the nodes above it (application first)."""

    node: A11yNode
    ancestors: tuple[A11yNode, ...]
    order: int


@dataclass(frozen=True, slots=True)
class A11yMatch:
    """The element chosen for a description, and why."""

    node: A11yNode
    """The element (for "the Name field", the field, not its label)."""
    box: Box
    """Its visible part: clipped to the screen, minus what the active window and open menus
    hide."""
    score: float
    """Total score (name + role + window + context)."""

    @property
    def point(self) -> tuple[int, int]:
        """Centre of `box`, screen pixels."""
        left, top, right, bottom = self.box
        return (left + right) // 2, (top + bottom) // 2

    def describe(self) -> str:
        """The node as one `as_text`-style line, with its score."""
        node = self.node
        return (
            f'[{node.role}] "{node.name}" ({node.x},{node.y},{node.width},{node.height}) '
            f"score={self.score:.2f}"
        )


def match(
    description: str | Description, tree: A11yTree, screen_size: tuple[int, int]
) -> A11yMatch | None:
    """The element of `tree` that best fits `description`, or None below `MIN_SCORE`.

    Pure: no desktop needed. `screen_size` (width, height) clips boxes; elements wholly off
    the screen, under the active window or under an open menu are left out.
    """
    wanted = description if isinstance(description, Description) else parse_description(description)
    target = normalise(wanted.name)
    if not target:
        return None
    placed = list(_placed(tree))
    active = _active_window(placed)
    covers = _covers(placed, active)
    ranked: list[tuple[float, int, int, A11yMatch]] = []
    for item in placed:
        found = _score(wanted, target, item, placed, active, covers, screen_size)
        if found is not None and found.score >= MIN_SCORE:
            left, top, right, bottom = found.box
            ranked.append((-found.score, (right - left) * (bottom - top), item.order, found))
    if not ranked:
        return None
    ranked.sort(key=lambda entry: entry[:3])
    return ranked[0][3]


def _placed(tree: A11yTree) -> Iterator[_Placed]:
    order = 0
    stack: list[tuple[A11yNode, tuple[A11yNode, ...]]] = [(node, ()) for node in tree.nodes]
    stack.reverse()
    while stack:
        node, ancestors = stack.pop()
        yield _Placed(node, ancestors, order)
        order += 1
        stack.extend((child, (*ancestors, node)) for child in reversed(node.children))


def _box(node: A11yNode) -> Box | None:
    if node.x is None or node.y is None or not node.width or not node.height:
        return None
    return node.x, node.y, node.x + node.width, node.y + node.height


def _active_window(placed: list[_Placed]) -> A11yNode | None:
    """The toplevel (child of an application) in the `active` state, if any."""
    return next(
        (item.node for item in placed if len(item.ancestors) == 1 and "active" in item.node.states),
        None,
    )


def _covers(placed: list[_Placed], active: A11yNode | None) -> list[tuple[A11yNode, Box]]:
    """What is drawn over other windows, with the node it belongs to: the active window,
    and each open menu's popup (the union of its items' boxes)."""
    covers = [(active, box)] if active is not None and (box := _box(active)) else []
    for item in placed:
        items = item.node.children if item.node.role == "menu" else []
        if boxes := [box for child in items if (box := _box(child)) is not None]:
            lefts, tops, rights, bottoms = zip(*boxes, strict=True)
            covers.append((item.node, (min(lefts), min(tops), max(rights), max(bottoms))))
    return covers


def _score(
    wanted: Description,
    target: str,
    item: _Placed,
    placed: list[_Placed],
    active: A11yNode | None,
    covers: list[tuple[A11yNode, Box]],
    screen_size: tuple[int, int],
) -> A11yMatch | None:
    node = item.node
    if node.role == "application" or "showing" not in node.states:
        return None
    score = max(
        name_score(target, normalise(node.name)),
        0.7 if node.description and normalise(node.description) == target else 0.0,
    )
    if score < MIN_NAME_SCORE:
        return None
    if wanted.roles & _TEXT_ENTRY and node.role == "label":
        field = _labelled_field(item, placed)
        if field is not None:
            item, node = field, field.node
    if wanted.roles:
        score += 0.2 if node.role in wanted.roles else -0.3
    lineage = (*item.ancestors, node)
    if active is not None and any(a is active for a in lineage):
        score += 0.1
    if wanted.context and _context_fits(wanted.context, item):
        score += 0.15
    over = [box for owner, box in covers if not any(owner is a for a in lineage)]
    box = _visible_box(node, over, screen_size)
    return None if box is None else A11yMatch(node, box, round(score, 3))


def _labelled_field(label: _Placed, placed: list[_Placed]) -> _Placed | None:
    """The editable element nearest to `label` among its parent's descendants."""
    label_box = _box(label.node)
    if not label.ancestors or label_box is None:
        return None
    parent = label.ancestors[-1]
    fields = [
        (abs(box[0] - label_box[2]) + abs(box[1] + box[3] - label_box[1] - label_box[3]), item)
        for item in placed
        if "editable" in item.node.states
        and item.node.role in _TEXT_ENTRY
        and (box := _box(item.node)) is not None
        and any(ancestor is parent for ancestor in item.ancestors)
    ]
    return min(fields, key=lambda pair: pair[0])[1] if fields else None


def _context_fits(context: str, item: _Placed) -> bool:
    """Whether the context ("Save As dialog", "Thunar") names one of the node's ancestors."""
    words = set(_words(normalise(context))) - set(_ROLE_WORDS) - {"the", "a", "an"}
    role = _role_word(context.lower())
    for ancestor in item.ancestors:
        ancestor_words = set(_words(normalise(ancestor.name)))
        if words and words <= ancestor_words:
            return True
        if not words and role and ancestor.role in _ROLE_WORDS.get(role, frozenset()):
            return True
    return False


def _visible_box(node: A11yNode, covers: list[Box], screen_size: tuple[int, int]) -> Box | None:
    """`node`'s box clipped to the screen, then the largest piece left by each cover."""
    box = _box(node)
    if box is None:
        return None
    width, height = screen_size
    left, top = max(box[0], 0), max(box[1], 0)
    right, bottom = min(box[2], width), min(box[3], height)
    for c_left, c_top, c_right, c_bottom in covers:
        if left >= right or top >= bottom:
            return None
        if c_left >= right or c_right <= left or c_top >= bottom or c_bottom <= top:
            continue
        pieces = [
            (left, top, right, min(bottom, c_top)),
            (left, max(top, c_bottom), right, bottom),
            (left, top, min(right, c_left), bottom),
            (max(left, c_right), top, right, bottom),
        ]
        pieces = [p for p in pieces if p[0] < p[2] and p[1] < p[3]]
        if not pieces:
            return None
        left, top, right, bottom = max(pieces, key=lambda p: (p[2] - p[0]) * (p[3] - p[1]))
    if left >= right or top >= bottom:
        return None
    return left, top, right, bottom


class A11yGrounder(Grounder):
    """Grounds descriptions in the desktop's accessibility tree, read through the SDK.

    Each `ground` call reads a fresh tree (the screenshot is not looked at: the tree is in
    screen pixels already), unless `prepare` was told of that screenshot: then the tree read
    when it was taken is used, read while the planner was thinking. Finds only what
    applications expose over AT-SPI: GTK3 apps out of the box; nothing drawn inside a
    canvas, a terminal or a web page's images.
    """

    source = "a11y"
    """What results from this grounder carry in `GroundingResult.source`."""

    def __init__(self, desktop: AsyncDesktop, *, app: str | None = None) -> None:
        self.desktop = desktop
        self.app = app
        """Only look in this application's windows (e.g. "mousepad"); None: every one."""
        self._prepared: tuple[Image.Image, asyncio.Task[A11yTree]] | None = None

    def prepare(self, screenshot: Image.Image, screen_size: tuple[int, int]) -> None:
        """Read the tree of the screen just seen in the background (see `Grounder.prepare`)."""
        self._forget()
        tree = asyncio.create_task(self.desktop.accessibility_tree(self.app))
        tree.add_done_callback(_retrieve)  # an unused read's failure is not an error
        self._prepared = (screenshot, tree)

    async def aclose(self) -> None:
        self._forget()

    def _forget(self) -> None:
        if self._prepared is not None:
            self._prepared[1].cancel()
            self._prepared = None

    async def ground(
        self,
        description: str,
        screenshot: bytes | Image.Image,
        screen_size: tuple[int, int],
    ) -> GroundingResult | None:
        """See `Grounder.ground`; None when no element scores `MIN_SCORE`."""
        started = time.monotonic()
        if self._prepared is not None and self._prepared[0] is screenshot:
            tree = await asyncio.shield(self._prepared[1])
        else:
            tree = await self.desktop.accessibility_tree(self.app)
        found = match(description, tree, screen_size)
        if found is None:
            return None
        x, y = found.point
        elapsed_ms = (time.monotonic() - started) * 1000
        return GroundingResult(
            x, y, found.box, raw=found.describe(), source=self.source, elapsed_ms=elapsed_ms
        )


def _retrieve(task: asyncio.Task[A11yTree]) -> None:
    if not task.cancelled():
        task.exception()
