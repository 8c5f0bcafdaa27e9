"""`code`: run_code("1+1") in a warm context against a fresh interpreter per call.

Ours: `POST /api/desktops/{id}/code` with `{"code": "1+1"}` on the desktop's default
Python context (a warm IPython process), read to its `end_of_execution` event, with the
standard library's `http.client` on one keep-alive connection (the API's figure), and the
same through the SDK (`Desktop.run_code`, blocking). Beside it, in the same run and on the
same desktop: `exec("python3 -c 'print(1+1)'")` through the API, a new interpreter per call,
what a caller without contexts does. Also: the first run in a new context (the process's
start included), a matplotlib chart round trip (a bar chart shown, its PNG back), and the
memory of an idle context (the proportional set size of its processes).
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench._run import Options, Target, progress
from bench._service import Service, desktop_pids, running_service
from bench._stats import Summary, ratio, summarize, timed
from cubicle.client.sdk import Desktop

TARGET_P50_MS = 5.0
TARGET_SPEEDUP = 10.0
_CHART = (
    "import matplotlib.pyplot as plt\n"
    "plt.figure(figsize=(6, 4))\n"
    "plt.bar(['a', 'b', 'c'], [3, 5, 2])\n"
    "plt.title('sales')\n"
    "plt.show()\n"
)


@dataclass(frozen=True)
class CodeResult:
    run_code_rest: Summary
    """run_code("1+1") through the API with `http.client`, warm context."""
    run_code_sdk: Summary
    """The same through the SDK: `Desktop.run_code("1+1")`."""
    exec_python_rest: Summary
    """exec("python3 -c 'print(1+1)'") through the API: a fresh interpreter per call."""
    speedup_vs_exec: float
    """exec's median over run_code's (REST)."""
    first_run_new_context: Summary
    """Create a context and run "1+1" in it: the process's start included."""
    chart_round_trip: Summary
    """A matplotlib bar chart shown, its PNG back (warm context, pyplot imported)."""
    chart_png_bytes: int
    idle_context_pss_mb: float
    """Proportional set size of one idle context's processes, MB (mean)."""
    targets: list[Target]


class _Rest:
    def __init__(self, service: Service, desktop_id: str) -> None:
        url = urlsplit(service.url)
        self._http = http.client.HTTPConnection(url.hostname, url.port)
        self._headers = {"Authorization": f"Bearer {service.token}"}
        self._prefix = f"/api/desktops/{desktop_id}"

    def post(self, path: str, body: dict) -> bytes:
        headers = {**self._headers, "Content-Type": "application/json"}
        self._http.request("POST", self._prefix + path, json.dumps(body), headers)
        answer = self._http.getresponse()
        content = answer.read()
        if answer.status >= 300:
            raise RuntimeError(f"{path}: {answer.status} {content[:300]!r}")
        return content

    def close(self) -> None:
        self._http.close()


def _pss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")), 0)


def run(options: Options) -> CodeResult:
    n = 30 if options.quick else 300
    n_slow = 3 if options.quick else 10
    with running_service(CUBICLE_WARM_POOL="0") as service:
        desktop = service.create_desktop()
        rest = _Rest(service, desktop.id)
        sdk = Desktop.connect(desktop.id, base_url=service.url, token=service.token)
        try:
            rest.post("/code", {"code": "import matplotlib.pyplot as plt"})
            for _ in range(10):
                rest.post("/code", {"code": "1+1"})
                sdk.run_code("1+1")
                rest.post("/exec", {"command": ["python3", "-c", "print(1+1)"]})
            progress(f"code: {n} warm runs each way")
            ours_rest, ours_sdk, exec_rest = [], [], []
            for _ in range(n):  # interleaved, so a busy moment falls on every way alike
                ours_rest += timed(lambda: rest.post("/code", {"code": "1+1"}), 1)
                ours_sdk += timed(lambda: sdk.run_code("1+1"), 1)
                exec_rest += timed(
                    lambda: rest.post("/exec", {"command": ["python3", "-c", "print(1+1)"]}), 1
                )
            progress("code: charts")
            png: list[int] = []

            def chart() -> None:
                run = sdk.run_code(_CHART)
                png.append(len(next(r.png for r in run.results if r.png)))

            charts = timed(chart, n_slow)
            progress("code: new contexts")
            before = set(desktop_pids(desktop.id))
            contexts = []

            def first_run() -> None:
                context = sdk.create_code_context()
                contexts.append(context)
                sdk.run_code("1+1", context=context)

            firsts = timed(first_run, n_slow)
            time.sleep(1.0)
            fresh = set(desktop_pids(desktop.id)) - before
            pss_mb = sum(_pss_kb(pid) for pid in fresh) / 1024 / max(len(contexts), 1)
            for context in contexts:
                sdk.remove_code_context(context)
        finally:
            sdk.close()
            rest.close()
    ours, theirs = summarize(ours_rest), summarize(exec_rest)
    speedup = ratio(theirs, ours)
    return CodeResult(
        run_code_rest=ours,
        run_code_sdk=summarize(ours_sdk),
        exec_python_rest=theirs,
        speedup_vs_exec=speedup,
        first_run_new_context=summarize(firsts),
        chart_round_trip=summarize(charts),
        chart_png_bytes=png[-1],
        idle_context_pss_mb=round(pss_mb, 1),
        targets=[
            Target(f"run_code('1+1') p50 <= {TARGET_P50_MS} ms", ours.p50_ms <= TARGET_P50_MS),
            Target(f">= {TARGET_SPEEDUP:g}x faster than a fresh interpreter", speedup >= 10),
        ],
    )
