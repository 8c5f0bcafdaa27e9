"""The process of one Python context: IPython's shell, driven over two pipes.

The guest runs this file's source with the desktop's `/usr/bin/python3 -c SOURCE CHARTS
REQ EVT` (standard library and IPython only: the guest's own packages are not on that
Python's path; `CHARTS` is the path of `charts.py`, loaded from there). It reads one JSON
request per line from fd `REQ` (`{"run", "code", "env"}`), runs it
with `InteractiveShell.run_cell`, and writes JSON events, one per line, to fd `EVT`:

    {"kind": "count", "n": 3}                        the cell's execution count
    {"kind": "result", "data": {mime: value}, "main": true|false}
    {"kind": "error", "name", "value", "traceback"}
    {"kind": "done", "run": N}                       run N (from its request) is over

    {"kind": "stream", "name": "stdout"|"stderr", "text"}   what the code printed

Printing through `sys.stdout`/`sys.stderr` arrives as `stream` events, in order with the
results; what subprocesses write to fds 1 and 2 goes to pipes the guest reads beside.
SIGINT interrupts a run and is ignored between runs. A Jupyter kernel does the same
through ZeroMQ and two threads; this takes a tenth of its time per run (docs/code.md).
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import sys
import threading
import time

_running = False
"""True while user code runs: only then does SIGINT raise `KeyboardInterrupt`."""


def _on_sigint(signum, frame) -> None:
    if _running:
        raise KeyboardInterrupt


def _jsonable(value):
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value


class _Events:
    """The events pipe: one JSON line per event, never torn by an interrupt."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def emit(self, event: dict) -> None:
        """Send `event` after what the code printed before it."""
        sys.stdout.flush()
        sys.stderr.flush()
        self.send(event)

    def send(self, event: dict) -> None:
        line = (json.dumps(event, default=str) + "\n").encode()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with self._lock:
                view = memoryview(line)
                while view:
                    view = view[os.write(self.fd, view) :]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class _Stream(io.TextIOBase):
    """`sys.stdout` or `sys.stderr`: text sent as `stream` events, in order with the
    results, a line or 64 KiB at a time, or what is pending every 50 ms."""

    def __init__(self, events: _Events, name: str, fd: int) -> None:
        self._events = events
        self._name = name
        self._fd = fd
        self._pending: list[str] = []
        self._size = 0
        self._lock = threading.RLock()
        self.buffer = io.BufferedWriter(io.FileIO(fd, "w", closefd=False))

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._pending.append(text)
            self._size += len(text)
            if self._size >= _STREAM_CHUNK:
                self.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self.buffer.flush()
            if self._pending:
                text, self._pending, self._size = "".join(self._pending), [], 0
                for start in range(0, len(text), _STREAM_CHUNK):  # one huge print: pieces
                    piece = text[start : start + _STREAM_CHUNK]
                    self._events.send({"kind": "stream", "name": self._name, "text": piece})


_STREAM_CHUNK = 1 << 16


def _flusher(streams: list[_Stream]) -> None:
    """Send what a run printed without a newline yet (a progress bar), every 50 ms."""
    while True:
        time.sleep(0.05)
        for stream in streams:
            stream.flush()


def _load(path: str):
    """A module of the guest's, by path (this Python does not have the guest's packages)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cubicle_charts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data_formats(shell, charts) -> None:
    """Give matplotlib figures a chart and DataFrames their columns, as display formats
    beside the PNG and HTML (`charts.py`); a failure there only leaves the format out.
    The formatters match by class in `__call__`, not as type printers: matplotlib's inline
    backend pops every formatter's Figure printer when it starts."""
    from IPython.core.formatters import JSONFormatter
    from traitlets import Unicode

    def formatter(mime: str, module: str, name: str, extract):
        def call(self, obj):
            if not any(c.__module__ == module and c.__name__ == name for c in type(obj).__mro__):
                return None
            try:
                return extract(obj)
            except Exception:
                return None

        kind = type("DataFormatter", (JSONFormatter,), {"format_type": Unicode(mime)})
        kind.__call__ = call
        return kind(parent=shell.display_formatter)

    for mime, module, name, extract in (
        (charts.MIME, "matplotlib.figure", "Figure", charts.figure_chart),
        (charts.DATA_MIME, "pandas.core.frame", "DataFrame", charts.dataframe_data),
    ):
        shell.display_formatter.formatters[mime] = formatter(mime, module, name, extract)


def _shell(events: _Events, charts):
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell

    class Hook(DisplayHook):
        """The last expression's value: a main result, not an `Out[n]:` line."""

        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict, md_dict=None) -> None:
            data = {mime: _jsonable(v) for mime, v in format_dict.items()}
            events.emit({"kind": "result", "data": data, "main": True})

        def finish_displayhook(self) -> None:
            pass

    class Publisher(DisplayPublisher):
        """`display()`, `plt.show()`: a result each."""

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False):
            data = {mime: _jsonable(v) for mime, v in data.items()}
            events.emit({"kind": "result", "data": data, "main": False})

        def clear_output(self, wait: bool = False) -> None:
            pass

    class Shell(InteractiveShell):
        def _showtraceback(self, etype, evalue, stb) -> None:
            name = getattr(etype, "__name__", str(etype))
            value = str(evalue)
            events.emit(
                {"kind": "error", "name": name, "value": value, "traceback": "\n".join(stb)}
            )

    shell = Shell.instance(displayhook_class=Hook, display_pub_class=Publisher, colors="NoColor")
    _data_formats(shell, charts)
    shell.display_formatter.active_types = list(shell.display_formatter.format_types)
    return shell


def _run(shell, events: _Events, request: dict) -> None:
    global _running
    env = request.get("env") or {}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        events.emit({"kind": "count", "n": shell.execution_count})
        _running = True
        shell.run_cell(request["code"], store_history=True)
        _running = False
    except KeyboardInterrupt:  # raised outside the user's code, as the run ended
        _running = False
        events.emit({"kind": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""})
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        events.emit({"kind": "done", "run": request.get("run")})


def main() -> None:
    charts_path, requests_fd, events_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sys.path[:] = [p for p in sys.path if p]  # not the working directory
    signal.signal(signal.SIGINT, _on_sigint)
    events = _Events(events_fd)
    streams = [_Stream(events, "stdout", 1), _Stream(events, "stderr", 2)]
    sys.stdout, sys.stderr = streams  # type: ignore[assignment]
    threading.Thread(target=_flusher, args=(streams,), daemon=True, name="flush").start()
    shell = _shell(events, _load(charts_path))
    requests = os.fdopen(requests_fd, "rb")
    events.emit({"kind": "ready"})
    while line := requests.readline():
        _run(shell, events, json.loads(line))


if __name__ == "__main__":
    main()
