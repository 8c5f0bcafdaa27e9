"""`grounding`: accuracy and latency of the offline grounders (a11y, OCR) on real screens.

`python -m bench.grounding [--quick]` prints the JSON result (progress goes to stderr).

One sandboxed desktop (1280×800) is walked through six screens: mousepad with the XFCE
panel, mousepad's open File menu, its Save As dialog (maximised: GTK makes it taller than
the screen), xfce4-terminal, thunar, and thunar's open Edit menu. Each app's window is
closed before the next app starts. On each screen, with the screen held still:

- Ground truth comes from one accessibility snapshot, taken by this harness: the targets
  are the elements of the focused window (plus the panel on the first screen) that are
  showing, have a non-empty name, and whose box, clipped to the screen, is at least 8×8
  pixels. Toplevel windows themselves and boxes covering half the screen or more are left
  out (any point would hit them), and so are elements an open menu's popup overlaps.
- `A11yGrounder` gets only the text "the {name} {role word}" (e.g. "the Save button",
  "the Places pane"): no node id, no box. It reads its own fresh tree, in which every
  element of every application is a possible distractor.
- `OcrGrounder` gets the name, in quotes, as the text to find, for text-labelled targets
  only: roles that draw their name (menus, menu items, buttons, labels, tabs, cells,
  column headers, list items, check and radio boxes, combo boxes, status bars, links) in a
  box at least 1.25 times as wide as tall (icon-only buttons are about square, no text).
- A hit is a point inside the target's box. A target whose name (letters and digits, any
  case) is shared by another element of the tree is "ambiguous": such targets are scored
  apart, since the description alone cannot tell the namesakes apart. The targets (95 %
  for a11y, 80 % for OCR) apply to the targets with a unique name.
- The ground truth is AT-SPI's own boxes; where an application reports a box that is not
  where it draws the element (seen on thunar's sidebar headings), a right OCR point
  counts as a miss, and the misses are listed so that they can be checked.

Latency: a11y is each `ground` call (a fresh tree over the SDK, then matching). OCR is
reported as the full read of a screenshot (`read_latency`, the engine warm; each screen
read once, or 3 times without --quick, by fresh grounders) and as matching on a screenshot
already read (`match_latency`); an agent pays one read and one match per step. The
machine's load is in the result: OCR shares the CPU with everything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from bench._run import machine, progress
from bench._service import Service, running_service
from bench._stats import summarize
from cubicle.agent.grounding.a11y import A11yGrounder
from cubicle.agent.grounding.ocr import OcrGrounder
from cubicle.client.sdk import AsyncDesktop
from cubicle.guest.a11y import find, walk
from cubicle.protocol.errors import WindowNotFound
from cubicle.protocol.models import A11yNode, A11yTree

T = TypeVar("T")
SCREEN = (1280, 800)
TARGET_A11Y = 0.95
"""Least accuracy of the a11y grounder on targets with a unique name."""
TARGET_OCR = 0.80
"""Least accuracy of the OCR grounder on text-labelled targets with a unique name."""
MIN_SIDE = 8
"""Pixels: smaller targets are left out."""
TEXT_ROLES = frozenset(
    {
        "menu", "menu item", "check menu item", "radio menu item", "push button",
        "toggle button", "label", "page tab", "table cell", "table column header",
        "list item", "check box", "radio button", "combo box", "status bar", "link",
    }
)  # fmt: skip
"""Roles that draw their name as text."""
ROLE_WORDS = {
    "push button": "button", "toggle button": "button", "check menu item": "menu item",
    "radio menu item": "menu item", "text": "field", "page tab": "tab", "table cell": "cell",
    "list item": "item", "table column header": "column header", "scroll pane": "pane",
    "directory pane": "pane", "split pane": "pane", "file chooser": "dialog",
    "tool bar": "toolbar", "check box": "checkbox",
}  # fmt: skip
"""AT-SPI role → the word a person (or a planner) would use; other roles are used as is."""
_MAX_MISSES = 30
"""Misses listed per grounder in the result."""


@dataclass
class _Tally:
    """Hits out of targets, overall and per app."""

    n: int = 0
    hits: int = 0
    per_app: dict[str, list[int]] = field(default_factory=dict)

    def add(self, app: str, hit: bool) -> None:
        self.n += 1
        self.hits += hit
        counts = self.per_app.setdefault(app, [0, 0])
        counts[0] += 1
        counts[1] += hit

    def report(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "hits": self.hits,
            "accuracy": round(self.hits / self.n, 4) if self.n else None,
            "per_app": {
                app: {"n": n, "hits": hits, "accuracy": round(hits / n, 4)}
                for app, (n, hits) in sorted(self.per_app.items())
            },
        }


@dataclass
class _Scores:
    """One grounder's results over every screen."""

    unique: _Tally = field(default_factory=_Tally)
    ambiguous: _Tally = field(default_factory=_Tally)
    latency_s: list[float] = field(default_factory=list)
    misses: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Target:
    node: A11yNode
    box: tuple[int, int, int, int]
    """Clipped to the screen."""
    ambiguous: bool


def _key(name: str) -> str:
    return "".join(char for char in name.casefold() if char.isalnum())


def _clipped(node: A11yNode) -> tuple[int, int, int, int] | None:
    if node.x is None or node.y is None or not node.width or not node.height:
        return None
    left, top = max(node.x, 0), max(node.y, 0)
    right, bottom = min(node.x + node.width, SCREEN[0]), min(node.y + node.height, SCREEN[1])
    if right - left < MIN_SIDE or bottom - top < MIN_SIDE:
        return None
    return left, top, right, bottom


def _targets(tree: A11yTree, tops: list[A11yNode]) -> list[_Target]:
    """Named, big-enough elements inside the toplevels `tops` and not under an open menu,
    flagged when their name is shared by another element of the tree."""
    counts: dict[str, int] = {}
    popups: list[tuple[A11yNode, tuple[int, int, int, int]]] = []
    for node in walk(tree):
        if node.role != "application" and _key(node.name) and _clipped(node):
            counts[_key(node.name)] = counts.get(_key(node.name), 0) + 1
        items = [box for child in node.children if (box := _clipped(child))]
        if node.role == "menu" and items:
            lefts, tops_, rights, bottoms = zip(*items, strict=True)
            popups.append((node, (min(lefts), min(tops_), max(rights), max(bottoms))))
    targets = []
    for top in tops:
        for node, lineage in _walk(top.children, (top,)):
            box = _clipped(node)
            if not _key(node.name) or box is None or "showing" not in node.states:
                continue
            if (box[2] - box[0]) * (box[3] - box[1]) >= SCREEN[0] * SCREEN[1] / 2:
                continue
            if any(
                not any(owner is a for a in lineage) and _overlap(box, popup)
                for owner, popup in popups
            ):
                continue  # drawn over by an open menu
            targets.append(_Target(node, box, counts[_key(node.name)] > 1))
    return targets


def _walk(
    nodes: list[A11yNode], ancestors: tuple[A11yNode, ...]
) -> Iterator[tuple[A11yNode, tuple[A11yNode, ...]]]:
    """Each node with itself and its ancestors, parents first."""
    for node in nodes:
        lineage = (*ancestors, node)
        yield node, lineage
        yield from _walk(node.children, lineage)


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _text_labelled(target: _Target) -> bool:
    left, top, right, bottom = target.box
    return target.node.role in TEXT_ROLES and right - left >= 1.25 * (bottom - top)


def _describe(node: A11yNode) -> str:
    return f"the {node.name} {ROLE_WORDS.get(node.role, node.role)}"


async def _wait(probe: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = 30) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


Scope = tuple[str, str, bool]
"""(application, toplevel name prefix, active toplevels only): where targets are taken from."""


class _Screens:
    """Puts the desktop in each benchmarked state; each step returns the scopes to score."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        self.desktop = desktop

    async def _node(self, app: str, name: str, role: str) -> A11yNode | None:
        found = find(await self.desktop.accessibility_tree(app), name=name, role=role, exact=True)
        return found[0] if found else None

    async def _active(self, app: str, prefix: str = "") -> bool:
        tree = await self.desktop.accessibility_tree(app)
        return any(_in_scope(top, (app, prefix, True)) for a in tree.nodes for top in a.children)

    async def _settled(self, app: str, prefix: str = "") -> None:
        await _wait(lambda: self._active(app, prefix), f"the active {app} window {prefix!r}")
        await self.desktop.wait_for_settle(quiet_ms=500)

    async def _open_menu(self, app: str, menu: str) -> None:
        node = await _wait(lambda: self._node(app, menu, "menu"), f"{app}'s {menu} menu")
        assert node.x is not None and node.y is not None and node.width and node.height
        await self.desktop.left_click(node.x + node.width // 2, node.y + node.height // 2)

        async def items() -> bool:
            opened = await self._node(app, menu, "menu")
            return bool(
                opened and any(child.role.endswith("menu item") for child in opened.children)
            )

        await _wait(items, f"{app}'s {menu} menu to open")
        await self.desktop.wait_for_settle(quiet_ms=500)

    async def _close(self, app: str) -> None:
        """Close `app`'s windows one by one (a dialog may go with its parent)."""

        async def closed() -> bool:
            windows = await self.desktop.get_application_windows(app)
            with contextlib.suppress(WindowNotFound):  # gone since it was listed
                if windows:
                    await self.desktop.window(windows[-1].id, "close")
            return not windows

        await _wait(closed, f"{app}'s windows to close")

    async def mousepad(self) -> list[Scope]:
        await self.desktop.launch("mousepad")
        await _wait(lambda: self._node("mousepad", "File", "menu"), "mousepad's menus")
        await self._settled("mousepad")
        return [("mousepad", "", True), ("xfce4-panel", "", False)]

    async def mousepad_file_menu(self) -> list[Scope]:
        await self._open_menu("mousepad", "File")
        return [("mousepad", "", True)]

    async def mousepad_save_as(self) -> list[Scope]:
        await self.desktop.press("escape")
        await self.desktop.press("ctrl+s")
        await self._settled("mousepad", "Save As")
        (dialog,) = [w for w in await self.desktop.get_windows() if w.title.startswith("Save As")]
        await self.desktop.window(dialog.id, "maximize")
        await _wait(self._save_fits, "the maximised Save As dialog's Save button on screen")
        await self._settled("mousepad", "Save As")
        return [("mousepad", "Save As", True)]

    async def _save_fits(self) -> bool:
        save = await self._node("mousepad", "Save", "push button")
        if save is None or save.y is None or save.height is None:
            return False
        return save.y + save.height <= SCREEN[1]

    async def terminal(self) -> list[Scope]:
        await self.desktop.press("escape")
        await self._close("Mousepad")
        await self.desktop.launch("xfce4-terminal")
        await self._settled("xfce4-terminal")
        return [("xfce4-terminal", "", True)]

    async def thunar(self) -> list[Scope]:
        await self._close("Xfce4-terminal")
        await self.desktop.launch("thunar")
        await _wait(lambda: self._node("Thunar", "File", "menu"), "thunar's menus")
        await self._settled("Thunar")
        return [("Thunar", "", True)]

    async def thunar_edit_menu(self) -> list[Scope]:
        await self._open_menu("Thunar", "Edit")
        return [("Thunar", "", True)]


def _in_scope(top: A11yNode, scope: Scope) -> bool:
    app, prefix, active_only = scope
    return (
        (top.app or "").casefold() == app.casefold()
        and top.name.startswith(prefix)
        and ("active" in top.states or not active_only)
    )


async def _score_screen(
    desktop: AsyncDesktop,
    name: str,
    scopes: list[Scope],
    reads: int,
    a11y: _Scores,
    ocr: _Scores,
    ocr_read_s: list[float],
) -> dict[str, Any]:
    screenshot = await desktop.screenshot()
    tree = await desktop.accessibility_tree()
    tops = [
        top for app in tree.nodes for top in app.children if any(_in_scope(top, s) for s in scopes)
    ]
    targets = _targets(tree, tops)
    text_targets = [target for target in targets if _text_labelled(target)]
    grounder = A11yGrounder(desktop)
    for target in targets:
        started = time.perf_counter()
        result = await grounder.ground(_describe(target.node), screenshot, SCREEN)
        a11y.latency_s.append(time.perf_counter() - started)
        _record(a11y, name, target, _describe(target.node), result)
    for _ in range(reads):  # fresh grounders: each reads the screenshot anew
        started = time.perf_counter()
        await OcrGrounder().read(screenshot, SCREEN)
        ocr_read_s.append(time.perf_counter() - started)
    reader = OcrGrounder()
    await reader.read(screenshot, SCREEN)
    for target in text_targets:
        started = time.perf_counter()
        asked = f'"{target.node.name}"'  # quoted: the name is the text, role words and all
        result = await reader.ground(asked, screenshot, SCREEN)
        ocr.latency_s.append(time.perf_counter() - started)
        _record(ocr, name, target, asked, result)
    progress(f"grounding: {name}: {len(targets)} targets, {len(text_targets)} with text")
    return {
        "screen": name,
        "apps": sorted({target.node.app or "" for target in targets}),
        "targets": len(targets),
        "text_targets": len(text_targets),
        "ambiguous_targets": sum(target.ambiguous for target in targets),
    }


def _record(scores: _Scores, screen: str, target: _Target, asked: str, result: Any) -> None:
    left, top, right, bottom = target.box
    hit = result is not None and left <= result.x < right and top <= result.y < bottom
    (scores.ambiguous if target.ambiguous else scores.unique).add(target.node.app or "", hit)
    if not hit and len(scores.misses) < _MAX_MISSES:
        scores.misses.append(
            {
                "screen": screen,
                "asked": asked,
                "role": target.node.role,
                "ambiguous": target.ambiguous,
                "box": target.box,
                "point": None if result is None else (result.x, result.y),
                "raw": None if result is None else result.raw,
            }
        )


def _report(scores: _Scores, latency: dict[str, Any], target: float) -> dict[str, Any]:
    both = _Tally(scores.unique.n + scores.ambiguous.n, scores.unique.hits + scores.ambiguous.hits)
    unique = scores.unique.report()
    return {
        "unique_names": unique,
        "ambiguous_names": scores.ambiguous.report(),
        "all": {k: v for k, v in both.report().items() if k != "per_app"},
        **latency,
        "target_accuracy": target,
        "met": unique["accuracy"] is not None and unique["accuracy"] >= target,
        "misses": scores.misses,
    }


async def _run(service: Service, quick: bool) -> dict[str, Any]:
    token = service.client.headers["authorization"].removeprefix("Bearer ")
    info = service.create_desktop()
    desktop = await AsyncDesktop.connect(info.id, base_url=service.url, token=token)
    a11y, ocr, ocr_read_s = _Scores(), _Scores(), []
    screens_done = []
    reads = 1 if quick else 3
    try:
        screens = _Screens(desktop)
        await OcrGrounder().read(await desktop.screenshot(), SCREEN)  # build the engine
        steps = [
            ("mousepad + panel", screens.mousepad),
            ("mousepad File menu", screens.mousepad_file_menu),
            ("mousepad Save As", screens.mousepad_save_as),
            ("xfce4-terminal", screens.terminal),
            ("thunar", screens.thunar),
            ("thunar Edit menu", screens.thunar_edit_menu),
        ]
        for name, arrange in steps:
            scopes = await arrange()
            screens_done.append(
                await _score_screen(desktop, name, scopes, reads, a11y, ocr, ocr_read_s)
            )
    finally:
        await desktop.kill()
    return {
        "screen_size": SCREEN,
        "screens": screens_done,
        "a11y": _report(a11y, {"latency": asdict(summarize(a11y.latency_s))}, TARGET_A11Y),
        "ocr": _report(
            ocr,
            {
                "read_latency": asdict(summarize(ocr_read_s)),
                "match_latency": asdict(summarize(ocr.latency_s)),
            },
            TARGET_OCR,
        ),
    }


def run(quick: bool) -> dict[str, Any]:
    """Start a service and a desktop, score both grounders on every screen, return the
    JSON-ready result. `quick` reads each screenshot once for OCR latency instead of 3 times."""
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    with running_service() as service:
        result = asyncio.run(_run(service, quick))
    result["load_avg_1m"] = {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2)}
    result["duration_s"] = round(time.perf_counter() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grounding", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one OCR read per screen")
    args = parser.parse_args(argv)
    document = {"machine": asdict(machine()), "quick": args.quick, "grounding": run(args.quick)}
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
