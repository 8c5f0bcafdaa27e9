"""`A11yGrounder` on a real desktop: mousepad's menus and its Save As dialog, read over AT-SPI
through the real service, clicked through the real service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from cubicle.agent.grounding.a11y import A11yGrounder, match, parse_description
from cubicle.agent.grounding.base import GroundingResult
from cubicle.client.sdk import AsyncDesktop
from cubicle.guest.a11y import find
from cubicle.protocol.models import A11yNode, A11yTree, WindowInfo

T = TypeVar("T")
SCREEN = (1280, 800)
"""The desktops' screen size (the service's default)."""


async def wait_for(probe: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = 20) -> T:
    """Await `probe` until it returns something truthy; fail naming `what` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.1)


async def window(desktop: AsyncDesktop, title_prefix: str) -> WindowInfo:
    """The window whose title starts with `title_prefix`, once it is focused."""

    async def probe() -> WindowInfo | None:
        found = [w for w in await desktop.get_windows() if w.title.startswith(title_prefix)]
        return found[0] if found and found[0].focused else None

    return await wait_for(probe, f"a focused window titled {title_prefix!r}…")


async def start_mousepad(service) -> AsyncDesktop:
    """A fresh desktop with mousepad's empty window focused and drawn."""
    desktop = await AsyncDesktop.create(base_url=service.url, token=service.token)
    try:
        await desktop.launch("mousepad")
        await window(desktop, "Untitled")
        await wait_for(lambda: node(desktop, "File", "menu"), "mousepad's File menu over AT-SPI")
        await desktop.wait_for_settle()
    except BaseException:
        await desktop.kill()
        raise
    return desktop


async def node(desktop: AsyncDesktop, name: str, role: str) -> A11yNode | None:
    """mousepad's showing element with exactly this name and role, from a fresh tree."""
    found = find(await desktop.accessibility_tree("mousepad"), name=name, role=role, exact=True)
    return found[0] if found else None


def inside(result: GroundingResult | None, element: A11yNode | None) -> bool:
    """Whether the grounded point lies in the element's box (screen pixels)."""
    assert result is not None and element is not None
    assert element.x is not None and element.y is not None
    assert element.width is not None and element.height is not None
    return (
        element.x <= result.x < element.x + element.width
        and element.y <= result.y < element.y + element.height
    )


@pytest.fixture(scope="module")
async def mousepad(service) -> AsyncIterator[AsyncDesktop]:
    desktop = await start_mousepad(service)
    try:
        yield desktop
    finally:
        await desktop.kill()


@pytest.mark.parametrize(
    ("description", "name", "role_word", "context"),
    [
        ("the Save button", "Save", "button", ""),
        ("the File menu", "File", "menu", ""),
        ("Save button in the dialog", "Save", "button", "dialog"),
        ("Save button in the Save As dialog", "Save", "button", "Save As dialog"),
        ("the text field labelled Name", "Name", "text field", ""),
        ("the Name field", "Name", "field", ""),
        ("OK", "OK", None, ""),
        ("click the 'Open Recent' menu item", "Open Recent", "menu item", ""),
        ("“Don't Save”", "Don't Save", None, ""),
        ("the File menu in Thunar", "File", "menu", "Thunar"),
        ("Zoom In", "Zoom In", None, ""),
        ("the Text Files combo box", "Text Files", "combo box", ""),
    ],
)
def test_descriptions_are_read_into_name_role_and_context(description, name, role_word, context):
    parsed = parse_description(description)
    assert (parsed.name, parsed.role_word, parsed.context) == (name, role_word, context)


def test_role_words_stand_for_atspi_roles():
    assert {"push button", "toggle button"} <= parse_description("the Save button").roles
    assert {"menu", "menu item"} <= parse_description("the File menu").roles
    assert "text" in parse_description("the Name field").roles
    assert parse_description("the General tab").roles == {"page tab"}
    assert parse_description("OK").roles == frozenset()


@pytest.mark.parametrize(
    ("description", "name"), [("the File menu", "File"), ("Search menu", "Search")]
)
async def test_menus_are_found_in_the_tree(mousepad: AsyncDesktop, description: str, name: str):
    grounder = A11yGrounder(mousepad)
    result = await grounder.ground(description, await mousepad.screenshot(), SCREEN)

    menu = await node(mousepad, name, "menu")
    assert inside(result, menu)
    assert result is not None and menu is not None
    assert result.source == "a11y"
    assert result.box == (menu.x, menu.y, menu.x + menu.width, menu.y + menu.height)
    assert f'[menu] "{name}"' in result.raw
    assert result.elapsed_ms > 0


async def test_clicking_the_grounded_point_opens_the_menu(mousepad: AsyncDesktop):
    result = await A11yGrounder(mousepad).ground("the File menu", b"", SCREEN)
    assert result is not None

    await mousepad.left_click(result.x, result.y)
    try:
        item = await wait_for(
            lambda: node(mousepad, "Save As...", "menu item"), "the File menu's Save As item"
        )
        opened = await A11yGrounder(mousepad).ground("the Save As menu item", b"", SCREEN)
        assert inside(opened, item)
    finally:
        await mousepad.press("escape")
        await wait_for(
            lambda: _absent(mousepad, "Save As...", "menu item"), "the File menu to close"
        )


async def _absent(desktop: AsyncDesktop, name: str, role: str) -> bool:
    return await node(desktop, name, role) is None


async def test_unknown_element_is_none(mousepad: AsyncDesktop):
    grounder = A11yGrounder(mousepad)
    assert await grounder.ground("the Frobnicate button", b"", SCREEN) is None
    assert await grounder.ground("the button", b"", SCREEN) is None


async def test_save_as_dialog(mousepad: AsyncDesktop):
    grounder = A11yGrounder(mousepad)
    await mousepad.press("ctrl+s")
    await window(mousepad, "Save As")
    try:
        # GTK sizes the file chooser taller than this 800-pixel screen; the guest fits it to
        # the screen, so its buttons are on screen and offered.
        async def on_screen() -> A11yNode | None:
            save = await node(mousepad, "Save", "push button")
            return save if save and save.y is not None and save.y + 36 <= SCREEN[1] else None

        save = await wait_for(on_screen, "the dialog's Save button on screen")
        for description in ("Save button in the Save As dialog", "the Save button"):
            assert inside(await grounder.ground(description, b"", SCREEN), save), description

        dialog_tree = await _subtree(mousepad, "Save As", "file chooser")
        (field,) = find(dialog_tree, role="text", states=["editable"])
        for description in ("the Name field", "the text field labelled Name"):
            assert inside(await grounder.ground(description, b"", SCREEN), field), description
        (label,) = find(dialog_tree, name="Name:", role="label")
        assert inside(await grounder.ground("the Name: label", b"", SCREEN), label)
    finally:
        await mousepad.press("escape")
        await window(mousepad, "Untitled")


async def _subtree(desktop: AsyncDesktop, name: str, role: str) -> A11yTree:
    """The part of mousepad's tree under its element with this name and role."""
    (top,) = find(await desktop.accessibility_tree("mousepad"), name=name, role=role, exact=True)
    return A11yTree(nodes=[top], node_count=0, elapsed_ms=0)


def _element(role: str, name: str, box: tuple[int, int, int, int], *children, states=()):
    x, y, width, height = box
    return A11yNode(
        role=role,
        name=name,
        x=x,
        y=y,
        width=width,
        height=height,
        states=["showing", "visible", *states],
        children=list(children),
    )


def _app(name: str, *windows: A11yNode) -> A11yNode:
    return A11yNode(role="application", name=name, app=name, children=list(windows))


def test_what_the_active_window_hides_is_not_offered():
    behind = _element(
        "frame",
        "Editor",
        (0, 0, 600, 400),
        _element("push button", "OK", (100, 100, 80, 30)),
        _element("push button", "Apply", (380, 100, 80, 30)),
    )
    front = _element("dialog", "Settings", (300, 50, 400, 300), states=("active",))
    tree = A11yTree(
        nodes=[_app("editor", behind), _app("settings", front)], node_count=5, elapsed_ms=1
    )

    ok = match("the OK button", tree, SCREEN)
    assert ok is not None and ok.box == (100, 100, 180, 130)
    assert match("the Apply button", tree, SCREEN) is None  # wholly under the dialog
    behind.children[1].x = 260  # now 260..340: its left 40 pixels show
    apply = match("the Apply button", tree, SCREEN)
    assert apply is not None and apply.box == (260, 100, 300, 130) and apply.point == (280, 115)


def test_an_open_menu_hides_what_lies_under_it():
    menu = _element(
        "menu", "File", (0, 30, 40, 25), _element("menu item", "Save", (0, 55, 200, 25))
    )
    label = _element("label", "Save", (10, 60, 50, 20))
    window = _element("frame", "Editor", (0, 0, 600, 400), menu, label, states=("active",))
    tree = A11yTree(nodes=[_app("editor", window)], node_count=4, elapsed_ms=1)

    found = match("Save", tree, SCREEN)
    assert found is not None and found.node.role == "menu item"
    menu.children.clear()  # the menu closes
    found = match("Save", tree, SCREEN)
    assert found is not None and found.node.role == "label"
