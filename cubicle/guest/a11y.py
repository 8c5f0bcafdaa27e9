"""Read the accessibility tree (AT-SPI) of the desktop: roles, names, states, screen boxes.

What applications need to be seen (measured on Debian 12, at-spi2-core 2.46, GTK 3.24):
a session D-Bus and at-spi2-core. The first application that asks for `org.a11y.Bus` makes
the session bus start `at-spi-bus-launcher`, which runs the accessibility bus and
`at-spi2-registryd` and puts the bus address on the X root window (`AT_SPI_BUS`); this
process finds it through `AT_SPI_BUS_ADDRESS`, else that property of `DISPLAY`, else the
session bus. GTK3 applications need nothing more: no `GNOME_ACCESSIBILITY`, no gsettings
`toolkit-accessibility`, no `ACCESSIBILITY_ENABLED`; only `NO_AT_BRIDGE=1` hides them
(`0` does not). GTK2 needs `GTK_MODULES=gail:atk-bridge` (GTK3 just logs that it has no
`gail`), Qt5 `QT_LINUX_ACCESSIBILITY_ALWAYS_ON=1`.

What a snapshot keeps. Boxes are `Atspi.CoordType.SCREEN` extents in screen pixels, the
coordinates of a full-size screenshot; a toplevel `frame` includes the window decorations.
With `only_showing` (the default) a node that is not both SHOWING and VISIBLE is left out
with its subtree: a GTK widget only shows when its ancestors do, and closed menus are such
subtrees (hundreds of items in an editor; an open menu's items are SHOWING and kept). A node
without a usable box (no size, or wholly left of or above the screen, like the
`-2147483648` position of unmapped menu items or the `-1` extents of GTK3 `page tab`s) is
not emitted, but its children are walked and take its place, so the text area inside a
page tab is still found. Application nodes are always listed, without a box.

Calls block on D-Bus, so a hung application could hang the caller: each call gets a
timeout (1 s, less as the time budget runs out; libatspi may wait twice that), an
application that times out is left out of this snapshot, and a snapshot that reaches its
node, depth or time limit returns what it gathered with `truncated` set.

AT-SPI starts lazily, once per process, for the `DISPLAY` and `DBUS_SESSION_BUS_ADDRESS`
seen then (libatspi cannot move to another bus after a successful start); a failed start
is undone so that a later call tries again. libatspi is not thread-safe: a lock serialises
calls, so call from one worker thread at a time (`asyncio.to_thread`). Tree-change events
queue on the accessibility bus between snapshots; each snapshot first processes them so
that libatspi's cache is current.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from cubicle.protocol.errors import A11yUnavailable, InvalidRequest
from cubicle.protocol.models import A11yNode, A11yTree

TEXT_CHARS = 200
"""Characters of an editable text widget's content kept in `A11yNode.text`."""
_CALL_TIMEOUT_MS = 1000
"""Longest wait for one AT-SPI call, in milliseconds."""
_MIN_CALL_TIMEOUT_MS = 50
"""Shortest call timeout used as the time budget runs out, in milliseconds."""
_TIMEOUT_FRACTION = 0.95
"""A call that lasts this fraction of its timeout is taken as timed out."""
_MAX_DRAIN = 10_000
"""Most pending main-context events processed before a snapshot."""
_TEXT_STATES = ("focused", "checked", "selected", "pressed", "expanded", "editable")
"""States worth showing in `as_text`; `showing`, `visible` and the like would be noise."""
_ENV_KEYS = ("DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "AT_SPI_BUS_ADDRESS")
"""Environment variables libatspi reads to find the accessibility bus."""

_lock = threading.Lock()


@dataclass(frozen=True)
class _Binding:
    """libatspi (`gi.repository.Atspi`, with GLib) started for the bus named by `env`."""

    atspi: Any
    glib: Any
    env: tuple[str | None, ...]
    """The values of `_ENV_KEYS` when AT-SPI was started."""


_binding: _Binding | None = None


class _Stop(Exception):
    """The snapshot reached its node limit or time budget."""


class _AppHung(Exception):
    """An application did not answer in time."""


def snapshot(
    *,
    app: str | None = None,
    max_depth: int = 30,
    max_nodes: int = 5000,
    only_showing: bool = True,
    budget_s: float = 5.0,
) -> A11yTree:
    """Read the accessibility tree of every application, or of those named `app`.

    `app` matches application names case-insensitively (`Mousepad` finds `mousepad`); no
    match gives a tree with no applications. `max_depth` counts levels below the
    application node; `max_nodes` counts every node, application nodes included;
    `budget_s` is the time in seconds the walk may take. Reaching any of them returns
    what was gathered with `truncated` set. Blocks; raises `A11yUnavailable` when the
    accessibility bus cannot be reached.
    """
    if max_depth < 0 or max_nodes < 1 or budget_s <= 0:
        raise InvalidRequest("max_depth must be ≥ 0, max_nodes ≥ 1 and budget_s > 0")
    with _lock:
        started = time.monotonic()
        binding = _connect()
        _drain(binding.glib)
        walker = _Walk(binding, started + budget_s, max_depth, max_nodes, only_showing)
        nodes = walker.applications(app)
        elapsed_ms = (time.monotonic() - started) * 1000
    return A11yTree(
        nodes=nodes, node_count=walker.count, elapsed_ms=elapsed_ms, truncated=walker.truncated
    )


def find(
    tree: A11yTree | None,
    *,
    name: str | None = None,
    role: str | None = None,
    app: str | None = None,
    states: Iterable[str] = (),
    exact: bool = False,
) -> list[A11yNode]:
    """The nodes matching every criterion given, best first; a fresh snapshot when `tree` is None.

    `name` matches case-insensitively with runs of whitespace as one space: an exact name
    ranks before a name that merely contains it (left out when `exact`). Then showing nodes
    rank before the rest, then tree order. `role` is an exact AT-SPI role name (`push
    button`), case-insensitive; `app` keeps one application's nodes; every one of `states`
    must be set. Application nodes, which have no box, only match `role="application"`.
    """
    if tree is None:
        tree = snapshot(app=app)
    wanted_name = _normalise(name) if name is not None else None
    wanted_role = role.casefold() if role is not None else None
    wanted_states = set(states)
    ranked: list[tuple[int, int, int, A11yNode]] = []
    for order, node in enumerate(walk(tree)):
        if app is not None and (node.app or "").casefold() != app.casefold():
            continue
        if wanted_role is None and node.role == "application":
            continue
        if wanted_role is not None and node.role.casefold() != wanted_role:
            continue
        if not wanted_states.issubset(node.states):
            continue
        closeness = 0
        if wanted_name is not None:
            have = _normalise(node.name)
            if have != wanted_name:
                if exact or not wanted_name or wanted_name not in have:
                    continue
                closeness = 1
        ranked.append((closeness, "showing" not in node.states, order, node))
    ranked.sort(key=lambda item: item[:3])
    return [node for *_, node in ranked]


def walk(tree: A11yTree) -> Iterator[A11yNode]:
    """Every node of `tree`, parents before children, in tree order."""
    stack = list(reversed(tree.nodes))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def as_text(tree: A11yTree, *, indent: str = "  ") -> str:
    """One line per node, indented by depth, for a language model to read.

    `[role] "name" (x,y,width,height) states`, with the box in screen pixels and only the
    telling states (`focused`, `checked`, `selected`, `pressed`, `expanded`, `editable`,
    plus `disabled` and `hidden` when a node is not enabled or not showing), then the
    description and text when there are any. Application lines carry `pid=` instead of a box.
    """
    lines: list[str] = []
    stack = [(node, 0) for node in reversed(tree.nodes)]
    while stack:
        node, level = stack.pop()
        lines.append(indent * level + _line(node))
        stack.extend((child, level + 1) for child in reversed(node.children))
    if tree.truncated:
        lines.append("(truncated: a limit was reached or an application did not answer)")
    return "\n".join(lines)


def _line(node: A11yNode) -> str:
    parts = [f"[{node.role}]", _quote(node.name)]
    if node.x is not None:
        parts.append(f"({node.x},{node.y},{node.width},{node.height})")
    elif node.pid is not None:
        parts.append(f"pid={node.pid}")
    if node.role != "application":
        parts.extend(state for state in _TEXT_STATES if state in node.states)
        if "enabled" not in node.states:
            parts.append("disabled")
        if "showing" not in node.states:
            parts.append("hidden")
    if node.description and node.description != node.name:
        parts.append(f"description={_quote(node.description)}")
    if node.text:
        parts.append(f"text={_quote(node.text)}")
    return " ".join(parts)


def _quote(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _normalise(value: str) -> str:
    return " ".join(value.split()).casefold()


def _connect() -> _Binding:
    """Start libatspi once for this process; the caller holds `_lock`."""
    global _binding
    env = tuple(os.environ.get(key) for key in _ENV_KEYS)
    if _binding is not None:
        if _binding.env != env:
            raise A11yUnavailable(
                "AT-SPI was started in this process for "
                f"{_describe(_binding.env)} and cannot switch to {_describe(env)}: "
                "read each desktop's accessibility tree from its own process"
            )
        return _binding
    try:
        import gi

        gi.require_version("Atspi", "2.0")
        from gi.repository import Atspi, GLib
    except (ImportError, ValueError) as exc:
        raise A11yUnavailable(
            "the AT-SPI client library is missing: install python3-gi and gir1.2-atspi-2.0"
        ) from exc
    if Atspi.init() == 2:
        Atspi.exit()  # undo the half start, or the next call would abort the process
        raise A11yUnavailable(
            f"cannot reach the accessibility bus ({_describe(env)}): AT-SPI needs a session "
            "D-Bus in DBUS_SESSION_BUS_ADDRESS (or the AT_SPI_BUS property on DISPLAY's "
            "root window) and at-spi2-core, whose at-spi-bus-launcher the session bus "
            "starts on demand"
        )
    _binding = _Binding(atspi=Atspi, glib=GLib, env=env)
    return _binding


def _describe(env: tuple[str | None, ...]) -> str:
    return ", ".join(f"{key}={value or 'unset'}" for key, value in zip(_ENV_KEYS, env, strict=True))


def _drain(glib: Any) -> None:
    """Process the tree-change events that arrived since the last snapshot."""
    context = glib.MainContext.default()
    for _ in range(_MAX_DRAIN):
        if not context.pending() or not context.iteration(False):
            return


def _is_timeout(message: str) -> bool:
    """Whether a libatspi error message says that the reply did not come in time."""
    message = message.lower()
    return "timeout" in message or "did not receive a reply" in message


class _Walk:
    """One pass over the tree, with its limits and what it has gathered."""

    def __init__(
        self, binding: _Binding, deadline: float, max_depth: int, max_nodes: int, showing: bool
    ) -> None:
        self._atspi = binding.atspi
        self._error = binding.glib.Error
        self._deadline = deadline
        """`time.monotonic()` seconds after which the walk stops."""
        self._max_depth = max_depth
        self._max_nodes = max_nodes
        self._only_showing = showing
        self._seen: set[Any] = set()
        """Elements visited, so that a tree with a cycle is walked once."""
        self.count = 0
        """Nodes gathered so far."""
        self.truncated = False

    def applications(self, app: str | None) -> list[A11yNode]:
        """Application nodes (all, or those named `app`) with what could be read below them.

        An application that stops answering is left out; one cut short by the node limit or
        the time budget keeps what was read.
        """
        desktop = self._atspi.get_desktop(0)
        try:
            count = self._call(desktop.get_child_count)
        except _AppHung:
            count = None
        if count is None or count < 0:
            raise A11yUnavailable(
                "the AT-SPI registry did not answer: is at-spi2-registryd running on the "
                "accessibility bus (at-spi2-core)?"
            )
        nodes: list[A11yNode] = []
        try:
            for index in range(count):
                self._check_limits()
                kept, counted = len(nodes), self.count
                try:
                    accessible = self._call(desktop.get_child_at_index, index)
                    if accessible is None:  # the application quit while it was being read
                        continue
                    name = (self._call(accessible.get_name) or "").strip()
                    if app is not None and name.casefold() != app.casefold():
                        continue
                    self._application(accessible, name, nodes)
                except _AppHung:  # its boxes may be stale: leave the whole application out
                    del nodes[kept:]
                    self.count = counted
                    self.truncated = True
        except _Stop:
            self.truncated = True
        return nodes

    def _application(self, accessible: Any, name: str, sink: list[A11yNode]) -> None:
        self._take_slot()
        node = A11yNode(
            role="application", name=name, app=name, pid=self._call(accessible.get_process_id)
        )
        sink.append(node)
        self._children(accessible, 0, name, node.children)

    def _children(self, accessible: Any, depth: int, app: str, sink: list[A11yNode]) -> None:
        count = self._call(accessible.get_child_count)
        if count is None or count <= 0:
            return
        if depth >= self._max_depth:
            self.truncated = True
            return
        for index in range(count):
            child = self._call(accessible.get_child_at_index, index)
            if child is not None:
                self._visit(child, depth + 1, app, sink)

    def _visit(self, accessible: Any, depth: int, app: str, sink: list[A11yNode]) -> None:
        """Append the node for `accessible` to `sink`, or its children when it has no box."""
        self._check_limits()
        if accessible in self._seen:
            return
        self._seen.add(accessible)
        state_set = self._call(accessible.get_state_set)
        if state_set is None:
            return
        states = [state.value_nick for state in state_set.get_states()]
        if self._only_showing and not ("showing" in states and "visible" in states):
            return
        rect = self._call(accessible.get_extents, self._atspi.CoordType.SCREEN)
        if rect is None:
            return
        if min(rect.width, rect.height, rect.x + rect.width, rect.y + rect.height) <= 0:
            self._children(accessible, depth, app, sink)  # no box: its children take its place
            return
        self._take_slot()
        role = self._call(accessible.get_role_name) or "unknown"
        node = A11yNode(
            role=role,
            name=(self._call(accessible.get_name) or "").strip(),
            description=(self._call(accessible.get_description) or "").strip(),
            states=states,
            x=rect.x,
            y=rect.y,
            width=rect.width,
            height=rect.height,
            app=app,
            text=self._text(accessible, role, states),
        )
        sink.append(node)
        self._children(accessible, depth, app, node.children)

    def _text(self, accessible: Any, role: str, states: list[str]) -> str | None:
        """The start of an editable widget's text; never a password field's."""
        if "editable" not in states or role == "password text":
            return None
        if "Text" not in (self._call(accessible.get_interfaces) or ()):
            return None
        length = self._call(accessible.get_character_count)
        if not length:
            return None
        return self._call(accessible.get_text, 0, min(length, TEXT_CHARS))

    def _call(self, method: Any, *args: Any) -> Any:
        """`method(*args)`, or None when the element is gone; `_AppHung` on a timeout.

        libatspi's property getters (name, description, child count) return an empty value
        instead of an error when the reply times out, so a call that lasts its whole
        timeout counts as one.
        """
        timeout_ms = self._limit_call_time()
        started = time.monotonic()
        try:
            result = method(*args)
        except self._error as exc:
            if _is_timeout(exc.message or ""):
                raise _AppHung from exc
            return None
        if (time.monotonic() - started) * 1000 >= timeout_ms * _TIMEOUT_FRACTION:
            raise _AppHung
        return result

    def _take_slot(self) -> None:
        """Count one more node, or stop at the node limit."""
        if self.count >= self._max_nodes:
            raise _Stop
        self.count += 1

    def _check_limits(self) -> None:
        if time.monotonic() >= self._deadline:
            raise _Stop

    def _limit_call_time(self) -> int:
        """Set and return the timeout of the next call, in milliseconds.

        libatspi's wait loop can let a call run up to twice its timeout, so the timeout is
        at most half the time left.
        """
        remaining_ms = int((self._deadline - time.monotonic()) * 1000)
        timeout_ms = max(_MIN_CALL_TIMEOUT_MS, min(_CALL_TIMEOUT_MS, remaining_ms // 2))
        self._atspi.set_timeout(timeout_ms, -1)
        return timeout_ms
