"""AT-SPI snapshots of real GTK3 applications on a real X session.

libatspi connects once per process, so every test here reads the bus of one `x_session`
(the module fixture below points this process at it); cases that need another bus run in
a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cubicle.guest import a11y
from cubicle.protocol.models import A11yNode, A11yTree

from .conftest import XSession

PROBE_APP = "cubicle-a11y-probe"
PROBE_POSITION = (200, 150)
"""Where the probe asks the window manager to put its window frame, screen pixels."""

PROBE = textwrap.dedent(
    """
    import json, os, sys
    import gi
    gi.require_version("Gtk", "3.0")
    from gi.repository import GLib, Gtk

    app_name, out_path, x, y = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    GLib.set_prgname(app_name)
    window = Gtk.Window(title="Cubicle probe")
    window.set_default_size(400, 260)
    box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL, spacing=6)
    save = Gtk.Button(label="Save")
    entry = Gtk.Entry()
    entry.set_text("hello entry")
    for widget in (Gtk.Button(label="Autosave"), save, Gtk.CheckButton(label="Remember me"), entry):
        box.pack_start(widget, False, False, 0)
    window.add(box)
    window.move(x, y)
    window.connect("destroy", Gtk.main_quit)

    def report():
        gdk_window = window.get_window()
        if gdk_window is None:
            return True
        frame = gdk_window.get_frame_extents()
        _, origin_x, origin_y = gdk_window.get_origin()
        dx, dy = save.translate_coordinates(window, 0, 0)
        size = save.get_allocation()
        geometry = {
            "frame": [frame.x, frame.y, frame.width, frame.height],
            "save": [origin_x + dx, origin_y + dy, size.width, size.height],
        }
        with open(out_path + ".tmp", "w") as out:
            json.dump(geometry, out)
        os.replace(out_path + ".tmp", out_path)
        return True

    GLib.timeout_add(100, report)
    window.show_all()
    Gtk.main()
    """
)
"""A GTK3 window that keeps writing where GTK itself says its frame and Save button are."""

ACCESSIBILITY_ENV = ["GTK_MODULES=gail:atk-bridge", "QT_LINUX_ACCESSIBILITY_ALWAYS_ON=1"]
"""What the desktop session sets for GTK2 and Qt; GTK3 must work with it too."""


@pytest.fixture(scope="module")
def a11y_session(x_session: XSession) -> Iterator[XSession]:
    """`x_session` with this process pointed at its session bus and display."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DISPLAY", x_session.env["DISPLAY"])
        patch.setenv("DBUS_SESSION_BUS_ADDRESS", x_session.env["DBUS_SESSION_BUS_ADDRESS"])
        patch.delenv("AT_SPI_BUS_ADDRESS", raising=False)
        yield x_session


@pytest.fixture(scope="module")
def probe(a11y_session: XSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe window, running; returns the file where it writes its geometry."""
    geometry = tmp_path_factory.mktemp("probe") / "geometry.json"
    _spawn_probe(a11y_session, PROBE_APP, geometry)
    _wait_for_node(PROBE_APP, name="Save", role="push button")
    deadline = time.monotonic() + 10
    while not geometry.exists():
        assert time.monotonic() < deadline, "the probe never wrote its geometry"
        time.sleep(0.05)
    return geometry


@pytest.fixture(scope="module")
def mousepad(a11y_session: XSession) -> None:
    a11y_session.spawn(["mousepad"])
    _wait_for_node("mousepad", name="File", role="menu")


def _spawn_probe(session: XSession, app: str, geometry: Path) -> subprocess.Popen:
    x, y = PROBE_POSITION
    argv = ["/usr/bin/python3", "-c", PROBE, app, str(geometry), str(x), str(y)]
    return session.spawn(["env", *ACCESSIBILITY_ENV, *argv])


def _wait_for_node(app: str, *, timeout_s: float = 20, **criteria: str) -> A11yNode:
    deadline = time.monotonic() + timeout_s
    while True:
        tree = a11y.snapshot(app=app)
        found = a11y.find(tree, **criteria)
        if found:
            return found[0]
        if time.monotonic() > deadline:
            pytest.fail(f"no node {criteria} in {app} after {timeout_s} s:\n{a11y.as_text(tree)}")
        time.sleep(0.2)


def _settled(read: Callable[[], tuple[object, object]], timeout_s: float = 5) -> tuple:
    """Read two views of one thing until they agree (the window may still be placed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        first, second = read()
        if first == second or time.monotonic() > deadline:
            return first, second
        time.sleep(0.1)


def _box(node: A11yNode) -> list[int | None]:
    return [node.x, node.y, node.width, node.height]


def test_gtk_button_has_its_screen_box(probe: Path) -> None:
    def read() -> tuple[object, object]:
        tree = a11y.snapshot(app=PROBE_APP)
        [frame] = a11y.find(tree, role="frame")
        [save] = a11y.find(tree, name="Save", role="push button", exact=True)
        geometry = json.loads(probe.read_text())
        return (_box(frame), _box(save)), (geometry["frame"], geometry["save"])

    (frame_box, save_box), (frame_expected, save_expected) = _settled(read)
    assert frame_box == frame_expected
    assert save_box == save_expected
    assert frame_box[:2] == list(PROBE_POSITION)
    fx, fy, fw, fh = frame_box
    sx, sy, sw, sh = save_box
    assert fx <= sx and sx + sw <= fx + fw
    assert fy <= sy and sy + sh <= fy + fh


def test_gtk_widgets_roles_states_and_text(probe: Path) -> None:
    tree = a11y.snapshot(app=PROBE_APP)
    [application] = tree.nodes
    assert application.role == "application"
    assert application.name == PROBE_APP
    assert application.pid is not None and application.x is None
    [save] = a11y.find(tree, name="Save", role="push button", exact=True)
    assert {"showing", "visible", "enabled"} <= set(save.states)
    assert save.app == PROBE_APP
    [check] = a11y.find(tree, name="Remember me")
    assert check.role == "check box"
    assert "checked" not in check.states
    [entry] = a11y.find(tree, role="text", states=["editable"])
    assert entry.text == "hello entry"
    assert a11y.find(tree, role="text", states=["editable", "checked"]) == []


def test_find_ranks_exact_name_first(probe: Path) -> None:
    found = a11y.find(None, name="save", app=PROBE_APP)
    assert [node.name for node in found] == ["Save", "Autosave"]
    assert a11y.find(None, name="  SAVE ", role="PUSH BUTTON", app=PROBE_APP)[0].name == "Save"
    assert a11y.find(None, name="no such label", app=PROBE_APP) == []
    assert [node.name for node in a11y.find(None, name="SAVE", exact=True)] == ["Save"]


def test_find_ranks_showing_before_hidden() -> None:
    def node(name: str, states: list[str]) -> A11yNode:
        return A11yNode(role="push button", name=name, states=states, x=0, y=0, width=5, height=5)

    hidden, showing, partial = node("Save", []), node("Save", ["showing"]), node("Save as", [])
    window = A11yNode(role="frame", name="w", states=["showing"], x=0, y=0, width=9, height=9)
    window.children = [partial, hidden, showing]
    application = A11yNode(role="application", name="app", app="app", children=[window])
    tree = A11yTree(nodes=[application], node_count=5, elapsed_ms=0)
    assert a11y.find(tree, name="save") == [showing, hidden, partial]
    assert a11y.find(tree, name="app") == []
    assert a11y.find(tree, name="app", role="application") == [application]


def test_mousepad_menu_bar(mousepad: None, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    tree = a11y.snapshot(app="mousepad")
    wall_ms = (time.monotonic() - started) * 1000
    everything = a11y.snapshot()
    with capsys.disabled():
        print(
            f"\nAT-SPI snapshot: mousepad {tree.node_count} nodes in {tree.elapsed_ms:.0f} ms "
            f"({wall_ms:.0f} ms wall); whole desktop {everything.node_count} nodes in "
            f"{everything.elapsed_ms:.0f} ms"
        )
    assert not tree.truncated
    [bar] = a11y.find(tree, role="menu bar")
    menus = [child.name for child in bar.children if child.role == "menu"]
    assert menus[:2] == ["File", "Edit"]
    text = a11y.as_text(tree)
    for child in bar.children[:2]:
        line = f'[menu] "{child.name}" ({child.x},{child.y},{child.width},{child.height})'
        assert line in text
        assert bar.y is not None and child.y == bar.y
    assert text.splitlines()[0].startswith('[application] "mousepad" pid=')
    assert "[text]" in text and "editable" in text


def test_app_filter(probe: Path, mousepad: None) -> None:
    everything = a11y.snapshot()
    names = [node.name for node in everything.nodes]
    assert "mousepad" in names and PROBE_APP in names
    only = a11y.snapshot(app="MousePad")
    assert [node.name for node in only.nodes] == ["mousepad"]
    nothing = a11y.snapshot(app="no-such-application")
    assert nothing.nodes == [] and nothing.node_count == 0 and not nothing.truncated


def test_limits_truncate(probe: Path) -> None:
    small = a11y.snapshot(app=PROBE_APP, max_nodes=3)
    assert small.node_count == 3 and small.truncated
    assert len(list(a11y.walk(small))) == 3
    shallow = a11y.snapshot(app=PROBE_APP, max_depth=1)
    assert shallow.truncated
    [application] = shallow.nodes
    assert [node.role for node in application.children] == ["frame"]
    assert application.children[0].children == []
    assert a11y.snapshot(app=PROBE_APP).truncated is False


def test_hung_application_is_left_out_in_bounded_time(
    a11y_session: XSession, mousepad: None, tmp_path: Path
) -> None:
    hung = _spawn_probe(a11y_session, "cubicle-hung-probe", tmp_path / "geometry.json")
    _wait_for_node("cubicle-hung-probe", name="Save", role="push button")
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        tree = a11y.snapshot(budget_s=3)
        elapsed_s = time.monotonic() - started
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    assert elapsed_s < 3.5
    assert tree.truncated
    names = [node.name for node in tree.nodes]
    assert "mousepad" in names and "cubicle-hung-probe" not in names
    assert a11y.find(tree, name="File", role="menu", app="mousepad")


UNREACHABLE = textwrap.dedent(
    """
    import os, sys, time
    from cubicle.protocol.errors import A11yUnavailable
    from cubicle.guest import a11y

    dead_bus, display, live_bus = sys.argv[1:4]
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = dead_bus
    os.environ.pop("DISPLAY", None)
    started = time.monotonic()
    try:
        a11y.snapshot()
    except A11yUnavailable as exc:
        print("unavailable", exc.code, round(time.monotonic() - started, 3), exc.message)
    else:
        print("answered")
    os.environ["DISPLAY"] = display  # the bus address is also on the root window
    print("apps", len(a11y.snapshot().nodes))
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = live_bus
    try:
        a11y.snapshot()
    except A11yUnavailable as exc:
        print("switch refused", exc.code)
    """
)


def test_unreachable_bus_raises(a11y_session: XSession, tmp_path: Path) -> None:
    dead = tmp_path / "dead-bus"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(dead))  # a socket nobody listens on: connections are refused
    env = {key: value for key, value in os.environ.items() if key != "AT_SPI_BUS_ADDRESS"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            UNREACHABLE,
            f"unix:path={dead}",
            a11y_session.display,
            a11y_session.env["DBUS_SESSION_BUS_ADDRESS"],
        ],
        env=env,
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    first, second, third = result.stdout.splitlines()
    word, code, seconds, message = first.split(" ", 3)
    assert (word, code) == ("unavailable", "a11y_unavailable")
    assert float(seconds) < 5
    assert "session D-Bus" in message and "at-spi2-core" in message
    assert second.startswith("apps ") and int(second.split()[1]) >= 1
    assert third == "switch refused a11y_unavailable"


def test_concurrent_callers_are_serialised(probe: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        trees = list(pool.map(lambda _: a11y.snapshot(app=PROBE_APP), range(8)))
    assert {tree.node_count for tree in trees} == {trees[0].node_count}
    assert all(a11y.find(tree, name="Save", exact=True) for tree in trees)
