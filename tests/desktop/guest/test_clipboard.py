"""The clipboard against real GTK applications that paste from it and copy to it."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from Xlib import X
from Xlib.display import Display

from cubicle.guest.clipboard import MAX_TEXT_BYTES, Clipboard
from cubicle.protocol.errors import InvalidRequest, PayloadTooLarge, SandboxError

from .conftest import XSession

TEXT = "héllo ✓ 你好 Ω\nsecond line\n\n\ttabbed 🙂 end"
LARGE = ("0123456789abcdé✓你\n" * 60_000)[:1_000_000]
"""About 1.2 MB of UTF-8: several INCR chunks."""
TIMEOUT_S = 20.0
"""Seconds a GTK helper may take to start and answer."""

PASTE = r"""
import json, sys
import gi
gi.require_version("Gdk", "3.0")
gi.require_version("Gtk", "3.0")
from gi.repository import Gdk, Gtk
clipboard = Gtk.Clipboard.get(Gdk.SELECTION_CLIPBOARD)
if sys.argv[1] == "targets":
    ok, atoms = clipboard.wait_for_targets()
    print(json.dumps(sorted(atom.name() for atom in atoms) if ok else None))
else:
    print(json.dumps(clipboard.wait_for_text()))
"""
"""Print the clipboard's text (or its targets) as JSON, the way a GTK app pastes."""

COPY = r"""
import sys
import gi
gi.require_version("Gdk", "3.0")
gi.require_version("Gtk", "3.0")
from gi.repository import Gdk, GdkPixbuf, GLib, Gtk
text = sys.stdin.buffer.read().decode("utf-8")
clipboard = Gtk.Clipboard.get(Gdk.SELECTION_CLIPBOARD)
if text == "<image>":
    clipboard.set_image(GdkPixbuf.Pixbuf.new(GdkPixbuf.Colorspace.RGB, False, 8, 4, 4))
else:
    clipboard.set_text(text, -1)
def ready():
    print("ready", flush=True)
GLib.idle_add(ready)
Gtk.main()
"""
"""Copy stdin's text (or a small image for `<image>`) to the clipboard; keep running to own it."""

Copier = Callable[[str], subprocess.Popen]


@pytest.fixture
def clipboard(x_session: XSession) -> Iterator[Clipboard]:
    board = Clipboard(x_session.display)
    board.start()
    yield board
    board.stop()


@pytest.fixture
def copy(x_session: XSession) -> Iterator[Copier]:
    """Run GTK programs that copy a text and own the clipboard until the test ends."""
    started: list[subprocess.Popen] = []

    def start(text: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            ["/usr/bin/python3", "-c", COPY],
            env=x_session.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        started.append(proc)
        proc.stdin.write(text.encode("utf-8"))
        proc.stdin.close()
        ready = _read_line(proc, TIMEOUT_S)
        assert ready == b"ready\n", "the GTK copier did not start"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _read_line(proc: subprocess.Popen, timeout_s: float) -> bytes:
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return line[0] if line else b""


def _paste(x_session: XSession, what: str = "text") -> object:
    done = subprocess.run(
        ["/usr/bin/python3", "-c", PASTE, what],
        env=x_session.env,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    return json.loads(done.stdout)


def _until_no_owner(x_session: XSession) -> None:
    """Wait until no client owns CLIPBOARD (the X server drops a dead owner asynchronously)."""
    display = Display(x_session.display)
    try:
        clipboard = display.intern_atom("CLIPBOARD")
        deadline = time.monotonic() + 5
        while display.get_selection_owner(clipboard) != X.NONE:
            assert time.monotonic() < deadline, "something still owns the clipboard"
            time.sleep(0.05)
    finally:
        display.close()


def test_empty_clipboard_reads_as_empty_text(x_session: XSession, clipboard: Clipboard) -> None:
    _until_no_owner(x_session)

    assert clipboard.get_text() == ""


def test_gtk_app_pastes_what_set_text_copied(x_session: XSession, clipboard: Clipboard) -> None:
    clipboard.set_text(TEXT)

    assert _paste(x_session) == TEXT
    assert clipboard.get_text() == TEXT


def test_offers_the_usual_text_targets(x_session: XSession, clipboard: Clipboard) -> None:
    clipboard.set_text("targets")

    targets = _paste(x_session, "targets")

    assert {"TARGETS", "UTF8_STRING", "STRING", "TEXT", "text/plain;charset=utf-8"} <= set(targets)


def test_get_text_reads_what_a_gtk_app_copied(clipboard: Clipboard, copy: Copier) -> None:
    copy(TEXT)

    assert clipboard.get_text() == TEXT


def test_another_app_copying_takes_over(clipboard: Clipboard, copy: Copier) -> None:
    clipboard.set_text("ours")
    copy("theirs ✓")

    assert clipboard.get_text() == "theirs ✓"
    clipboard.set_text("ours again")
    assert clipboard.get_text() == "ours again"


def test_large_text_goes_both_ways(x_session: XSession, clipboard: Clipboard, copy: Copier) -> None:
    clipboard.set_text(LARGE)
    assert _paste(x_session) == LARGE

    copy(LARGE[::-1])
    assert clipboard.get_text(timeout_s=10) == LARGE[::-1]


def test_concurrent_reads_all_get_the_text(clipboard: Clipboard, copy: Copier) -> None:
    copy(TEXT)
    results: list[str] = []

    threads = [
        threading.Thread(target=lambda: results.append(clipboard.get_text())) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)

    assert results == [TEXT] * 8


def test_an_owner_that_does_not_answer_times_out(clipboard: Clipboard, copy: Copier) -> None:
    copier = copy("late")
    copier.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(SandboxError, match=r"within 0\.5 s"):
            clipboard.get_text(timeout_s=0.5)
        assert time.monotonic() - started < 1.5
    finally:
        copier.send_signal(signal.SIGCONT)

    # The late answer to the first read is not taken for the second one's.
    assert clipboard.get_text() == "late"
    assert clipboard.get_text() == "late"


def test_an_image_on_the_clipboard_is_not_text(clipboard: Clipboard, copy: Copier) -> None:
    copy("<image>")

    with pytest.raises(InvalidRequest, match="not text"):
        clipboard.get_text()


def test_text_over_the_limit_is_refused(clipboard: Clipboard) -> None:
    with pytest.raises(PayloadTooLarge, match="limit"):
        clipboard.set_text("x" * (MAX_TEXT_BYTES + 1))


def test_stop_is_idempotent_and_ends_calls(x_session: XSession) -> None:
    board = Clipboard(x_session.display)
    board.start()
    board.set_text("bye")

    board.stop()
    board.stop()

    with pytest.raises(SandboxError, match="stopped"):
        board.get_text()
    _until_no_owner(x_session)  # closing the connection gave the clipboard up
