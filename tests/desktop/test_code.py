"""Code contexts: real IPython processes in a real desktop, through the API and the SDK."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from cubicle import AsyncDesktop, Desktop, InvalidRequest, NotFound
from tests.conftest import create_desktop


@pytest.fixture(scope="module")
def d(service, desktop):
    handle = Desktop.connect(desktop["id"], base_url=service.url, token=service.token)
    yield handle
    handle.close()


def test_state_is_kept_between_runs(d):
    assert d.run_code("x = 41").error is None
    run = d.run_code("x + 1")
    assert run.text == "42"
    assert run.results[0].is_main_result
    assert run.execution_count >= 2
    printed: list[str] = []
    run = d.run_code("print('hi', x)", on_stdout=printed.append)
    assert run.logs.stdout == ["hi 41\n"] and printed == ["hi 41\n"]
    assert run.results == []


def test_plt_show_gives_a_png_of_the_figure(d):
    run = d.run_code(
        "%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}\n"
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(4, 3), dpi=100)\n"
        "plt.bar(['a', 'b'], [3, 5])\n"
        "plt.show()\n"
    )
    assert run.error is None, run.error
    [chart] = [r for r in run.results if r.png]
    assert not chart.is_main_result
    image = Image.open(io.BytesIO(base64.b64decode(chart.png)))
    assert image.format == "PNG" and image.size == (400, 300)


def test_a_dataframe_gives_html_and_text(d):
    run = d.run_code("import pandas as pd\npd.DataFrame({'city': ['Oslo'], 'n': [7]})")
    [result] = run.results
    assert "<table" in result.html and "Oslo" in result.html
    assert "Oslo" in run.text
    assert result.data == {"city": ["Oslo"], "n": [7]}  # the columns, as data
    assert "data" in result.formats()


CHARTS = """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.bar(['north', 'south', 'east'], [12, 30, 7], label='2026')
ax.set_title('Sales'); ax.set_xlabel('region'); ax.set_ylabel('units')
plt.show()
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [2, 4, 8], label='doubling')
ax.plot([1, 2, 3], [3, 3, 3])
ax.set_yscale('log')
plt.show()
fig, ax = plt.subplots()
ax.scatter([0.5, 1.5], [10, 20], label='samples')
plt.show()
fig, ax = plt.subplots()
ax.pie([1, 1, 2], labels=['tea', 'milk', 'water'])
ax.set_title('Drinks')
plt.show()
fig, (left, right) = plt.subplots(1, 2)
left.bar(['a', 'b'], [1, 2]); right.plot([0, 1], [1, 0]); fig.suptitle('Both');
"""


def test_figures_come_back_as_chart_data_beside_their_png(d):
    """Bar, line, scatter and pie charts, and two axes in one figure (left open at the
    end of the run): what each shows, read from matplotlib's artists."""
    run = d.run_code(CHARTS)
    assert run.error is None, run.error
    bar, line, scatter, pie, both = [r.chart for r in run.results]
    assert all(r.png for r in run.results)
    assert bar["type"] == "bar" and bar["title"] == "Sales"
    assert (bar["x_label"], bar["y_label"]) == ("region", "units")
    assert [(e["label"], e["value"], e["group"]) for e in bar["elements"]] == [
        ("north", 12, "2026"),
        ("south", 30, "2026"),
        ("east", 7, "2026"),
    ]
    assert line["type"] == "line" and line["y_scale"] == "log" and line["x_scale"] == "linear"
    assert [e["label"] for e in line["elements"]] == ["doubling", ""]
    assert line["elements"][0]["points"] == [[1, 2], [2, 4], [3, 8]]
    assert line["x_ticks"] and len(line["x_ticks"]) == len(line["x_tick_labels"])
    assert scatter["type"] == "scatter"
    assert scatter["elements"] == [{"label": "samples", "points": [[0.5, 10], [1.5, 20]]}]
    assert pie["type"] == "pie" and pie["title"] == "Drinks"
    assert [(e["label"], e["angle"]) for e in pie["elements"]] == [
        ("tea", 90.0),
        ("milk", 90.0),
        ("water", 180.0),
    ]
    assert both["type"] == "superchart" and both["title"] == "Both"
    assert [c["type"] for c in both["elements"]] == ["bar", "line"]
    assert "chart" in run.results[0].formats()


def test_an_exception_gives_name_value_traceback_and_the_next_run_works(d):
    run = d.run_code("def f():\n    return 1 / 0\nf()")
    assert run.error.name == "ZeroDivisionError"
    assert run.error.value == "division by zero"
    assert "return 1 / 0" in run.error.traceback and "\x1b[" not in run.error.traceback
    assert d.run_code("'still here'").text == "'still here'"


def test_a_timeout_interrupts_an_endless_loop_and_the_context_keeps_its_state(d):
    d.run_code("kept = 'yes'")
    started = time.monotonic()
    run = d.run_code("while True: pass", timeout_s=2)
    assert run.error.name == "TimeoutError"
    assert time.monotonic() - started < 10
    assert d.run_code("kept").text == "'yes'"


def test_a_dead_kernel_is_reported_and_the_next_run_restarts_it(d):
    context = d.create_code_context()
    d.run_code("lost = 1", context=context)
    run = d.run_code("import os; os._exit(1)", context=context)
    assert run.error.name == "KernelDied"
    run = d.run_code("1 + 1", context=context)
    assert run.text == "2"
    assert "restarted" in "".join(run.logs.stderr)
    assert d.run_code("lost", context=context).error.name == "NameError"
    d.remove_code_context(context)


def test_contexts_do_not_share_state_and_can_be_managed(d):
    first = d.create_code_context()
    second = d.create_code_context(cwd="/tmp")
    d.run_code("mine = 'first'", context=first)
    assert d.run_code("mine", context=second).error.name == "NameError"
    assert d.run_code("import os; os.getcwd()", context=second).text == "'/tmp'"
    assert {first.id, second.id} <= {c.id for c in d.list_code_contexts()}
    d.restart_code_context(first)
    assert d.run_code("mine", context=first).error.name == "NameError"
    d.remove_code_context(first)
    d.remove_code_context(second)
    with pytest.raises(NotFound):
        d.run_code("1", context=first.id)


def test_env_vars_apply_to_one_run(d):
    run = d.run_code("import os; os.environ.get('CUBICLE_T')", envs={"CUBICLE_T": "v"})
    assert run.text == "'v'"
    assert d.run_code("import os; os.environ.get('CUBICLE_T')").text is None


def test_a_bash_context_keeps_its_shell_between_runs(d):
    context = d.create_code_context(language="bash", cwd="/tmp")
    assert context.language == "bash"
    run = d.run_code("greeting=hello; cd /usr; echo out; echo err >&2", context=context)
    assert run.logs.stdout == ["out\n"] and run.logs.stderr == ["err\n"] and run.error is None
    assert d.run_code("echo $greeting $PWD", context=context).logs.stdout == ["hello /usr\n"]
    failed = d.run_code("false", context=context)
    assert failed.error.name == "ExitCode" and failed.error.value == "1"
    once = d.run_code("echo $TOKEN", context=context, envs={"TOKEN": "for one run"})
    assert once.logs.stdout == ["for one run\n"]
    assert d.run_code("echo [$TOKEN]", context=context).logs.stdout == ["[]\n"]
    other = d.run_code("echo [$greeting]", language="bash")  # the default bash context
    assert other.logs.stdout == ["[]\n"]
    d.remove_code_context(context)


def test_a_bash_timeout_stops_the_rest_of_the_run_and_keeps_the_shell(d):
    d.run_code("kept=yes", language="bash")
    started = time.monotonic()
    run = d.run_code("sleep 30; echo never", language="bash", timeout_s=2)
    assert run.error.name == "TimeoutError" and run.logs.stdout == []
    assert time.monotonic() - started < 10
    assert d.run_code("echo $kept", language="bash").logs.stdout == ["yes\n"]
    ended = d.run_code("exit 3", language="bash")
    assert ended.error.name == "ExitCode" and "status 3" in ended.error.value
    after = d.run_code("echo [$kept]", language="bash")
    assert after.logs.stdout == ["[]\n"] and "restarted" in "".join(after.logs.stderr)


def test_a_javascript_context_keeps_its_globals_and_awaits_a_promise(d):
    context = d.create_code_context(language="js")
    assert context.language == "javascript"
    run = d.run_code("let total = 40; console.log('hi'); total + 2", context=context)
    assert run.logs.stdout == ["hi\n"] and run.text == "42" and run.results[0].is_main_result
    assert d.run_code("total", context=context).text == "40"
    later = d.run_code(
        "new Promise(done => setTimeout(() => done(total * 2), 50))", context=context
    )
    assert later.text == "80"
    failed = d.run_code("null.x", context=context)
    assert failed.error.name == "TypeError" and "null" in failed.error.value
    stopped = d.run_code("while (true) {}", context=context, timeout_s=2)
    assert stopped.error.name == "TimeoutError"
    assert d.run_code("total + 1", context=context).text == "41"
    d.remove_code_context(context)


def test_an_unknown_language_is_a_clear_422(api, desktop, d):
    answer = api.post(
        f"/api/desktops/{desktop['id']}/code", json={"code": "1", "language": "cobol"}
    )
    assert answer.status_code == 422, answer.text
    assert "cobol" in answer.json()["detail"] and "python" in answer.json()["detail"]
    with pytest.raises(InvalidRequest):
        d.create_code_context(language="cobol")


def _rss_peak_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))


def test_a_flood_of_output_streams_through_the_service(api, service, desktop):
    """50 MB printed arrive as they are printed; the service's peak memory barely moves."""
    api.post(f"/api/desktops/{desktop['id']}/code", json={"code": "1"}).raise_for_status()
    peak_before = _rss_peak_kb(service.process.pid)
    code = "import time\nfor _ in range(50):\n    print('x' * 999_999)\n    time.sleep(0.01)"
    received, first_at, types = 0, None, []
    with api.stream(
        "POST", f"/api/desktops/{desktop['id']}/code", json={"code": code}, timeout=120
    ) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            event = json.loads(line)
            types.append(event["type"])
            if event["type"] == "stdout":
                first_at = first_at or time.monotonic()
                received += len(event["text"])
        ended_at = time.monotonic()
    assert received == 50_000_000
    assert types[-1] == "end_of_execution" and "error" not in types
    assert ended_at - first_at > 0.3  # the first output came well before the end
    grown_mb = (_rss_peak_kb(service.process.pid) - peak_before) / 1024
    assert grown_mb < 25, f"the service's peak memory grew {grown_mb:.0f} MB"


async def test_the_async_sdk_streams_results_as_they_come(service, desktop):
    ad = await AsyncDesktop.connect(desktop["id"], base_url=service.url, token=service.token)
    try:
        seen: list[str] = []
        run = await ad.run_code(
            "print('a')\nimport sys; print('b', file=sys.stderr)\n3 * 3",
            on_stderr=seen.append,
            on_result=lambda r: seen.append(r.text),
        )
        assert run.logs.stdout == ["a\n"] and run.logs.stderr == ["b\n"]
        assert seen == ["b\n", "9"]
    finally:
        await ad.close()


def test_the_rest_route_answers_ndjson_events(api, desktop):
    answer = api.post(f"/api/desktops/{desktop['id']}/code", json={"code": "print(1)\n2"})
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    events = [json.loads(line) for line in answer.text.splitlines()]
    assert [e["type"] for e in events] == [
        "number_of_executions",
        "stdout",
        "result",
        "end_of_execution",
    ]
    assert events[2]["text"] == "2" and events[2]["is_main_result"] is True


def test_prints_and_results_arrive_in_the_order_the_code_made_them(api, desktop):
    code = (
        "from IPython.display import display, HTML\n"
        "print('before')\n"
        "display(HTML('<b>shown</b>'))\n"
        "print('after', end='')\n"
        "import subprocess; subprocess.run(['echo', 'from a subprocess'])\n"
        "'last'"
    )
    answer = api.post(f"/api/desktops/{desktop['id']}/code", json={"code": code})
    events = [json.loads(line) for line in answer.text.splitlines()]
    shown = [
        (e["type"], e.get("html") or e.get("text"))
        for e in events
        if e["type"] in ("stdout", "result")
    ]
    # What Python prints keeps its place among the results; a subprocess writes to the
    # process's own stdout, read beside them: it arrives, its place is not promised.
    subprocess_line = ("stdout", "from a subprocess\n")
    assert subprocess_line in shown
    assert [e for e in shown if e != subprocess_line] == [
        ("stdout", "before\n"),
        ("result", "<b>shown</b>"),
        ("stdout", "after"),
        ("result", "'last'"),
    ]


def test_the_readme_analyze_data_flow_runs_as_printed(service, tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"<!-- snippet: analyze-data -->\n```python\n(.*?)```", readme, re.S)
    env = os.environ | {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
    ran = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == (
        "bar [('Jan', 120), ('Feb', 135), ('Mar', 160), ('Apr', 155)]\nmean monthly growth: 9.3 %\n"
    )
    assert Image.open(tmp_path / "sales.png").format == "PNG"


def test_an_endless_loop_is_interrupted_from_the_api(api, desktop, d):
    context = d.create_code_context()
    base = f"/api/desktops/{desktop['id']}"
    d.run_code("kept = 7", context=context)
    with api.stream(
        "POST", f"{base}/code", json={"code": "while True: pass", "context_id": context.id}
    ) as answer:
        lines = answer.iter_lines()
        assert json.loads(next(lines))["type"] == "number_of_executions"
        interrupted = api.post(f"{base}/contexts/{context.id}/interrupt")
        assert interrupted.status_code == 204
        events = [json.loads(line) for line in lines]
    assert events[0]["name"] == "KeyboardInterrupt" and events[-1]["type"] == "end_of_execution"
    assert d.run_code("kept", context=context).text == "7"
    d.remove_code_context(context)


def test_a_caller_that_goes_away_stops_its_run_and_the_context_answers(api, desktop, d):
    context = d.create_code_context()
    base = f"/api/desktops/{desktop['id']}"
    with api.stream(
        "POST", f"{base}/code", json={"code": "while True: pass", "context_id": context.id}
    ) as answer:
        assert json.loads(next(answer.iter_lines()))["type"] == "number_of_executions"
    started = time.monotonic()
    assert d.run_code("'free'", context=context, timeout_s=20).text == "'free'"
    assert time.monotonic() - started < 10
    d.remove_code_context(context)


def test_code_past_the_desktops_memory_ends_its_kernel_not_the_desktop(api, service):
    info = create_desktop(api, memory_mb=768)
    try:
        small = Desktop.connect(info["id"], base_url=service.url, token=service.token)
        run = small.run_code("hog = bytearray(2 * 1024**3)", timeout_s=60)
        assert run.error.name == "KernelDied", run.error
        assert small.run_code("6 * 7").text == "42"
        assert api.get(f"/api/desktops/{info['id']}").json()["status"] == "ready"
        assert small.screenshot()[:4] == b"\x89PNG"
        small.close()
    finally:
        api.delete(f"/api/desktops/{info['id']}")
