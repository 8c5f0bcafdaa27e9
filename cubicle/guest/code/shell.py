"""The process of one Python context: IPython's shell, driven over two pipes.

The guest runs this file's source with the desktop's `/usr/bin/python3 -c SOURCE REQ EVT`
(standard library and IPython only: the guest's own packages are not on that Python's
path). It reads one JSON request per line from fd `REQ` (`{"run", "code", "env"}`), runs it
with `InteractiveShell.run_cell`, and writes JSON events, one per line, to fd `EVT`:

    {"kind": "count", "n": 3}                        the cell's execution count
    {"kind": "result", "data": {mime: value}, "main": true|false}
    {"kind": "error", "name", "value", "traceback"}
    {"kind": "done", "run": N}                       run N (from its request) is over

What the code prints goes to fds 1 and 2, which the guest reads as the run's stdout and
stderr (subprocesses' output included); both are flushed before each event, so the guest
reads a run's output before the event that follows it. SIGINT interrupts a run and is
ignored between runs. A Jupyter kernel does the same through ZeroMQ and two threads;
this takes a tenth of its time per run (docs/code.md).
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import sys

_running = False
"""True while user code runs: only then does SIGINT raise `KeyboardInterrupt`."""


def _on_sigint(signum, frame) -> None:
    if _running:
        raise KeyboardInterrupt


def _jsonable(value):
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value


class _Events:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def emit(self, event: dict) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        line = (json.dumps(event, default=str) + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self.fd, view) :]


def _shell(events: _Events):
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
    requests_fd, events_fd = int(sys.argv[1]), int(sys.argv[2])
    try:
        with open("/proc/self/oom_score_adj", "w") as score:
            score.write("800")  # the OOM killer takes a context before the desktop
    except OSError:
        pass
    sys.path[:] = [p for p in sys.path if p]  # not the working directory
    for fd, name in ((1, "stdout"), (2, "stderr")):  # a line at a time, as a terminal
        raw = io.BufferedWriter(io.FileIO(fd, "w", closefd=False))
        setattr(sys, name, io.TextIOWrapper(raw, line_buffering=True))
    signal.signal(signal.SIGINT, _on_sigint)
    events = _Events(events_fd)
    shell = _shell(events)
    requests = os.fdopen(requests_fd, "rb")
    events.emit({"kind": "ready"})
    while line := requests.readline():
        _run(shell, events, json.loads(line))


if __name__ == "__main__":
    main()
