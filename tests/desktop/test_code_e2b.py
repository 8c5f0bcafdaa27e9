"""E2B's code-interpreter surface, read by the released `e2b-code-interpreter` SDK's own
parsers (`parse_output`, `Context.from_json`, `extract_exception`) from real kernels."""

from __future__ import annotations

import base64
import io

import pytest
from e2b_code_interpreter.charts import BarChart, ChartType, LineChart
from e2b_code_interpreter.models import Context, Execution, extract_exception, parse_output
from PIL import Image


@pytest.fixture(scope="module")
def base(desktop) -> str:
    return f"/api/desktops/{desktop['id']}/e2b-code-interpreter"


def _execute(api, base: str, **body) -> Execution:
    """What `Sandbox.run_code` does with the answer, with the SDK's own functions."""
    body = {"context_id": None, "language": None, "env_vars": None} | body
    execution = Execution()
    with api.stream("POST", f"{base}/execute", json=body, timeout=120) as answer:
        assert extract_exception(answer) is None
        for line in answer.iter_lines():
            parse_output(execution, line)
    return execution


def test_execute_answers_what_the_e2b_sdk_parses(api, base):
    assert api.get(f"{base}/health").status_code == 200
    _execute(api, base, code="import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})")
    run = _execute(api, base, code="print('rows', len(df))\ndf")
    assert run.logs.stdout == ["rows 2\n"]
    assert "<table" in run.results[0].html and run.results[0].is_main_result
    assert run.text == run.results[0].text
    assert run.execution_count >= 2
    chart = _execute(
        api, base, code="import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
    )
    png = Image.open(io.BytesIO(base64.b64decode(chart.results[0].png)))
    assert png.format == "PNG"
    line = chart.results[0].chart  # deserialized by the SDK into its own classes
    assert isinstance(line, LineChart) and line.type == ChartType.LINE
    assert line.elements[0].points == [(0, 1), (1, 3), (2, 2)]
    drawn = "import matplotlib.pyplot as plt\nplt.bar(['x', 'y'], [4, 6])\nplt.title('T');"
    bars = _execute(api, base, code=drawn)
    bar = bars.results[0].chart
    assert isinstance(bar, BarChart) and bar.title == "T"
    assert [(e.label, e.value) for e in bar.elements] == [("x", 4), ("y", 6)]
    assert "chart" in bars.results[0].formats()
    failed = _execute(api, base, code="raise ValueError('bad input')")
    assert (failed.error.name, failed.error.value) == ("ValueError", "bad input")
    assert "bad input" in failed.error.traceback


def test_contexts_answer_in_e2b_shapes(api, base):
    created = api.post(f"{base}/contexts", json={"language": "python", "cwd": "/tmp"})
    assert extract_exception(created) is None
    context = Context.from_json(created.json())
    assert (context.language, context.cwd) == ("python", "/tmp")
    _execute(api, base, code="here = 1", context_id=context.id)
    assert _execute(api, base, code="here").error.name == "NameError"  # the default one
    listed = [Context.from_json(c) for c in api.get(f"{base}/contexts").json()]
    assert context.id in [c.id for c in listed]
    restarted = api.post(f"{base}/contexts/{context.id}/restart")
    assert extract_exception(restarted) is None
    assert _execute(api, base, code="here", context_id=context.id).error.name == "NameError"
    assert extract_exception(api.delete(f"{base}/contexts/{context.id}")) is None
    missing = api.post(f"{base}/execute", json={"code": "1", "context_id": context.id})
    assert type(extract_exception(missing)).__name__ == "NotFoundException"
    both = api.post(
        f"{base}/execute", json={"code": "1", "context_id": "python", "language": "python"}
    )
    assert both.status_code == 422 and "exclusive" in both.text


def test_bash_and_javascript_contexts_answer_in_e2b_shapes(api, base):
    """`language="bash"` and `"js"` keep their state between runs like Python's, and the
    SDK reads their output, values and errors."""
    _execute(api, base, code="export GREETING=hello; cd /tmp", language="bash")
    shell = _execute(api, base, code="echo $GREETING from $(pwd)", language="bash")
    assert shell.logs.stdout == ["hello from /tmp\n"], shell
    failed = _execute(api, base, code="ls /no-such-dir", language="bash")
    assert failed.error is not None and "No such file" in "".join(failed.logs.stderr), failed
    _execute(api, base, code="let total = 40", language="js")
    counted = _execute(api, base, code="console.log('adding'); total + 2", language="js")
    assert counted.logs.stdout == ["adding\n"] and counted.text == "42", counted
    thrown = _execute(api, base, code="throw new TypeError('no way')", language="javascript")
    assert (thrown.error.name, thrown.error.value) == ("TypeError", "no way"), thrown
