"""The process of one Bash context: a persistent `bash`, driven over the same pipes as
`shell.py` (a JSON request per line in, a JSON event per line out).

The guest runs this file's source with the desktop's `/usr/bin/python3 -c SOURCE REQ EVT`
(standard library only). It starts one `bash --noprofile --norc` whose variables,
functions, working directory and exported environment last from run to run. Each run's
code is written to a file that bash sources with stdin from /dev/null; what bash writes to
stdout and stderr is read here and sent as `stream` events, and bash reports the run's end
and the status of its last command on a pipe of its own. A non-zero status is an `error`
event named `ExitCode` (E2B's Bash kernel reports it the same way). SIGINT (the guest
interrupts the process group) stops the run: the rest of the code is not run, bash lives.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile

_CHUNK = 1 << 16
_PRELUDE = """
__cubicle_run() {{
    trap 'trap - INT; return 130' INT
    . "$1" </dev/null
    local status=$?
    trap - INT
    return $status
}}
__cubicle_run_and_report() {{
    __cubicle_run "$1"
    printf 'end %s\\n' "$?" >&{fd}
}}
"""
"""Defined in bash once: source a run's file, stopping at SIGINT, and report its status.
(`ended` tells the guest the process ends after this run: `exit` ended its bash.)"""


class _Events:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, event: dict) -> None:
        view = memoryview((json.dumps(event) + "\n").encode())
        while view:
            view = view[os.write(self.fd, view) :]


def _forward(events: _Events, fds: dict[int, str], until: int) -> int | None:
    """Send bash's output as it comes until the `until` pipe reports the run's end; the
    run's status, or None if bash ended."""
    report = b""
    while True:
        readable, _, _ = select.select([*fds, until], [], [])
        for fd in readable:
            if fd == until:
                continue
            data = os.read(fd, _CHUNK)
            if data:
                text = data.decode(errors="replace")
                events.send({"kind": "stream", "name": fds[fd], "text": text})
        if until in readable:
            data = os.read(until, _CHUNK)
            if not data:
                return None
            report += data
            if report.endswith(b"\n"):
                _drain(events, fds)
                return int(report.split()[-1])


def _drain(events: _Events, fds: dict[int, str]) -> None:
    """What bash wrote before it reported the end, still in the pipes."""
    for fd, name in fds.items():
        while select.select([fd], [], [], 0)[0]:
            data = os.read(fd, _CHUNK)
            if not data:
                break
            events.send({"kind": "stream", "name": name, "text": data.decode(errors="replace")})


def main() -> None:
    requests_fd, events_fd = int(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # for this driver; bash gets SIGINT
    events = _Events(events_fd)
    report_r, report_w = os.pipe()  # a low number: bash keeps 10 and up for itself
    bash = subprocess.Popen(
        ["bash", "--noprofile", "--norc"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(report_w,),
        preexec_fn=lambda: (
            signal.signal(signal.SIGINT, signal.SIG_DFL),
            os.dup2(report_w, 3),
        ),
    )
    os.close(report_w)
    assert bash.stdin is not None and bash.stdout is not None and bash.stderr is not None
    outputs = {bash.stdout.fileno(): "stdout", bash.stderr.fileno(): "stderr"}
    bash.stdin.write(_PRELUDE.format(fd=report_w).encode())
    bash.stdin.flush()
    runs = 0
    cells = tempfile.mkdtemp(prefix="cubicle-bash-")
    events.send({"kind": "ready"})
    requests = os.fdopen(requests_fd, "rb")
    while line := requests.readline():
        request = json.loads(line)
        runs += 1
        cell = os.path.join(cells, f"run-{runs}.sh")
        with open(cell, "w") as file:
            file.write(request["code"])
        env = request.get("env") or {}
        events.send({"kind": "count", "n": runs})
        bash.stdin.write(
            f"{_set(env)}__cubicle_run_and_report {_quote(cell)}\n{_reset(env)}".encode()
        )
        bash.stdin.flush()
        status = _forward(events, outputs, report_r)
        os.unlink(cell)
        if status is None:  # bash ended (`exit`): so does this context
            value = f"bash exited with status {bash.wait()}; the next run starts a new one"
            events.send({"kind": "error", "name": "ExitCode", "value": value, "traceback": ""})
            events.send({"kind": "ended", "why": "its bash exited"})
            events.send({"kind": "done", "run": request.get("run")})
            return
        if status == 130:
            events.send(
                {"kind": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""}
            )
        elif status != 0:
            events.send(
                {"kind": "error", "name": "ExitCode", "value": str(status), "traceback": ""}
            )
        events.send({"kind": "done", "run": request.get("run")})


def _set(env: dict[str, str]) -> str:
    """Bash that exports `env` for one run, keeping what each name held before."""
    return "".join(
        f'__cubicle_had_{n}="${{{n}+1}}"; __cubicle_was_{n}="${{{n}-}}"; export {n}={_quote(v)}\n'
        for n, v in env.items()
    )


def _reset(env: dict[str, str]) -> str:
    """Bash that gives each name of `env` back what it held before the run."""
    return "".join(
        f'if [ -n "$__cubicle_had_{n}" ]; then export {n}="$__cubicle_was_{n}"; '
        f"else unset {n}; fi; unset __cubicle_had_{n} __cubicle_was_{n}\n"
        for n in env
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


if __name__ == "__main__":
    main()
