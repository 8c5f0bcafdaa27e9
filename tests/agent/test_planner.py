"""Planners against the scripted model server: the JSON schema, re-asking with the problem fed
back, model failures, coordinate conventions, UI-TARS actions, history, and the settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from cubicle.agent import actions as p
from cubicle.agent._model import ChatModel
from cubicle.agent.errors import ModelError
from cubicle.agent.grounding._image import PreparedImage
from cubicle.agent.planner import ChatPlanner, Observation, PastStep, PlanError, a11y_text
from cubicle.agent.settings import load_settings
from cubicle.agent.uitars import UiTarsPlanner
from cubicle.protocol.errors import InvalidRequest
from cubicle.protocol.models import A11yNode, A11yTree
from tests.agent.fake_model import FakeModelServer, Turn

pytestmark = pytest.mark.fast

TASK = "Write a haiku in the text editor and save it as ~/haiku.txt"


def screen(size: tuple[int, int]) -> Image.Image:
    """A grey screen with a red square in the middle."""
    image = Image.new("RGB", size, (200, 200, 200))
    width, height = size
    ImageDraw.Draw(image).rectangle(
        (width // 2 - 20, height // 2 - 20, width // 2 + 20, height // 2 + 20), fill=(255, 0, 0)
    )
    return image


def observe(size: tuple[int, int] = (1280, 800), **kwargs) -> Observation:
    return Observation(TASK, 1, screen(size), size, **kwargs)


def model(server: FakeModelServer, **kwargs) -> ChatModel:
    return ChatModel("planner-7b", server.url, **({"retry_backoff_s": 0.01} | kwargs))


def answer(thought: str = "", **action) -> str:
    return json.dumps({"thought": thought, "action": action})


# --- the schema ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (answer("open it", type="click", target="the File menu"),
         p.Click(type="click", target="the File menu")),
        ('```json\n{"action": {"type": "key", "keys": "ctrl+s"}}\n```', p.PressKey(keys="ctrl+s")),
        ('Sure! {"thought": "t", "action": {"type": "right_click", "target": [3, 4]}} Done.',
         p.Click(type="right_click", target=(3, 4))),
        ('{"type": "scroll", "direction": "down"}', p.Scroll(direction="down")),
        (answer(type="drag", start="the file icon", end=[10, 20]),
         p.Drag(start="the file icon", end=(10, 20))),
        (answer(type="done", summary="saved"), p.Done(summary="saved")),
    ],
)  # fmt: skip
def test_answers_that_follow_the_schema(raw: str, expected: p.PlannedAction):
    assert p.parse_answer(raw).action == expected


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("I will click the File menu.", "no JSON object"),
        ('{"action": {"type": "click", "target": }}', "not valid JSON"),
        (answer(type="tap", target="x"), "does not match any of the expected tags"),
        (answer(type="click"), "action.click.target: Field required"),
        (answer(type="type", text="hi", target="x"), "Extra inputs are not permitted"),
        (answer(type="exec", command="ls"), "exec is not allowed"),
    ],
)
def test_answers_that_do_not_say_what_to_fix(raw: str, problem: str):
    with pytest.raises(p.AnswerError, match=problem):
        p.parse_answer(raw)


def test_exec_only_when_allowed():
    assert p.parse_answer(answer(type="exec", command="ls"), allow_exec=True).action == p.Exec(
        command="ls"
    )


def test_the_prompt_lists_every_action():
    prompt = ChatPlanner(ChatModel("m", "http://127.0.0.1:9/v1"), allow_exec=True).system_prompt(
        (1280, 800)
    )
    for kind in p.ACTION_TYPES:
        assert f'"type": "{kind}"' in prompt
    assert "1280×800" in prompt
    closed = ChatPlanner(ChatModel("m", "http://127.0.0.1:9/v1")).system_prompt((1280, 800))
    assert '"type": "exec"' not in closed


# --- the JSON planner against a model server ------------------------------------------------


async def test_a_decision_by_description(fake_model: FakeModelServer):
    fake_model.script([answer("The editor is open; open the File menu.", type="click",
                              target="the File menu")])  # fmt: skip
    async with model(fake_model) as chat:
        decision = await ChatPlanner(chat).decide(observe(), [])
    assert decision.action == p.Click(type="click", target="the File menu")
    assert decision.thought == "The editor is open; open the File menu."
    assert decision.image.size == (1280, 800)
    (call,) = decision.calls
    assert call.error is None and call.attempts == 1 and call.elapsed_ms > 0
    assert "[image 1280×800]" in call.prompt and TASK in call.prompt
    (request,) = fake_model.requests
    assert request.body["model"] == "planner-7b" and request.body["temperature"] == 0
    assert request.messages[0]["role"] == "system"
    assert "screenshot of the whole screen (1280×800 pixels)" in request.text
    assert f"The task: {TASK}" in request.text
    assert request.image_sizes == [(1280, 800)]


@pytest.mark.parametrize(
    ("family", "size", "point", "sent", "expected"),
    [
        ("generic", (1920, 1080), [640, 360], (1280, 720), (960, 540)),
        ("qwen2.5-vl", (1920, 1080), [966, 546], (1932, 1092), (960, 540)),
        ("uground", (1280, 800), [500, 500], (1280, 800), (640, 400)),
    ],
)
async def test_points_in_answers_map_to_the_screen(
    fake_model: FakeModelServer, family, size, point, sent, expected
):
    fake_model.script([answer(type="double_click", target=point)])
    async with model(fake_model) as chat:
        decision = await ChatPlanner(chat, family=family).decide(observe(size), [])
    assert decision.action == p.Click(type="double_click", target=expected)
    assert fake_model.requests[0].image_sizes == [sent]


async def test_an_unusable_answer_is_asked_again_with_the_problem(fake_model: FakeModelServer):
    fake_model.script(["I would click on File.", answer(type="tap"),
                       answer(type="key", keys="ctrl+s")])  # fmt: skip
    async with model(fake_model) as chat:
        decision = await ChatPlanner(chat).decide(observe(), [])
    assert decision.action == p.PressKey(keys="ctrl+s")
    first, second, third = decision.calls
    assert "no JSON object" in (first.error or "") and "'tap'" in (second.error or "")
    assert third.error is None
    requests = fake_model.requests
    assert requests[1].messages[-2] == {"role": "assistant", "content": "I would click on File."}
    assert "That answer could not be used: the answer holds no JSON object" in requests[1].text
    assert len(requests[2].messages) == len(requests[0].messages) + 4


async def test_answers_that_stay_unusable_fail_the_step(fake_model: FakeModelServer):
    fake_model.script(["nope", "still nope", answer(type="click", target=[5000, 5])])
    async with model(fake_model) as chat:
        with pytest.raises(PlanError, match="unusable 3 times in a row") as caught:
            await ChatPlanner(chat, max_parse_retries=2).decide(observe(), [])
    assert "off the screen" in str(caught.value)
    assert [call.answer for call in caught.value.calls][:2] == ["nope", "still nope"]
    assert len(fake_model.requests) == 3


async def test_500s_are_retried_with_backoff_then_a_model_error(fake_model: FakeModelServer):
    fake_model.script([Turn.error(500, "CUDA out of memory")] * 3)
    async with model(fake_model, retry_backoff_s=0.1) as chat:
        with pytest.raises(ModelError) as caught:
            await ChatPlanner(chat).decide(observe(), [])
    assert caught.value.status == 500 and caught.value.attempts == 3
    assert "planner model endpoint" in str(caught.value)
    assert "HTTP 500 on all 3 attempts" in str(caught.value)
    assert "CUDA out of memory" in str(caught.value)
    first, second, third = (request.received_at for request in fake_model.requests)
    assert second - first >= 0.1 and third - second >= 0.2


async def test_a_500_then_an_answer_is_fine(fake_model: FakeModelServer):
    fake_model.script([Turn.error(503), answer(type="wait", seconds=2)])
    async with model(fake_model) as chat:
        decision = await ChatPlanner(chat).decide(observe(), [])
    assert decision.action == p.Wait(seconds=2) and decision.calls[0].attempts == 2


async def test_a_hang_times_out(fake_model: FakeModelServer):
    fake_model.script([Turn.hang(10.0)] * 2)
    async with model(fake_model, timeout_s=0.3, max_retries=1) as chat:
        with pytest.raises(ModelError, match=r"did not answer within 0\.3 s \(2 attempts\)"):
            await ChatPlanner(chat).decide(observe(), [])


async def test_garbage_that_is_no_completion_is_retried_then_a_model_error(
    fake_model: FakeModelServer,
):
    fake_model.script([Turn.garbage()] * 3)
    async with model(fake_model, retry_backoff_s=0.1) as chat:
        with pytest.raises(ModelError, match="not a chat completion: '<html>502 Bad Gateway"):
            await ChatPlanner(chat).decide(observe(), [])
    assert len(fake_model.requests) == 3
    first, second, third = (request.received_at for request in fake_model.requests)
    assert second - first >= 0.1 and third - second >= 0.2


async def test_garbage_then_an_answer_is_fine(fake_model: FakeModelServer):
    fake_model.script([Turn.garbage(), answer(type="wait", seconds=2)])
    async with model(fake_model, retry_backoff_s=0.1) as chat:
        decision = await ChatPlanner(chat).decide(observe(), [])
    assert decision.action == p.Wait(seconds=2) and decision.calls[0].attempts == 2


def _past(step: int, with_image: bool) -> PastStep:
    image = PreparedImage(data_url=f"data:image/png;base64,{_png_b64()}", size=(16, 10))
    raw = answer(f"thought {step}", type="key", keys="tab")
    return PastStep(step, raw, f"ok: key tab ({step})", image if with_image else None)


def _png_b64() -> str:
    import base64
    import io

    buffer = io.BytesIO()
    Image.new("RGB", (16, 10)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_history_keeps_all_text_and_the_screenshots_it_still_has(
    fake_model: FakeModelServer,
):
    fake_model.script([answer(type="done")])
    history = [_past(1, False), _past(2, False), _past(3, True), _past(4, True)]
    async with model(fake_model) as chat:
        await ChatPlanner(chat).decide(observe(a11y_text="menu 'File'"), history)
    (request,) = fake_model.requests
    assert request.image_sizes == [(16, 10), (16, 10), (1280, 800)]
    for step in (1, 2, 3, 4):
        assert f"thought {step}" in request.text and f"ok: key tab ({step})" in request.text
    assert request.text.count("(screenshot no longer shown)") == 2
    assert "menu 'File'" in request.text
    roles = [message["role"] for message in request.messages]
    assert roles == ["system", "user"] + ["assistant", "user"] * 4


def test_the_accessibility_tree_as_text():
    def node(role, name="", states=("showing",), children=(), box=(0, 0, 10, 10)):
        x, y, w, h = box
        return A11yNode(role=role, name=name, states=list(states), x=x, y=y, width=w,
                        height=h, children=list(children))  # fmt: skip

    menu = node("menu bar", children=[node("menu", "File"), node("menu", "Edit")])
    hidden = node("push button", "Hidden", states=())
    text = node("text", states=("showing", "focused"))
    frame = node("frame", "Untitled 1 - Mousepad", children=[menu, hidden, text])
    app = A11yNode(role="application", name="mousepad", children=[frame])
    empty = A11yNode(role="application", name="xfsettingsd")
    tree = A11yTree(nodes=[empty, app], node_count=8, elapsed_ms=1.0)
    assert a11y_text(tree).splitlines() == [
        "application 'mousepad'",
        "  frame 'Untitled 1 - Mousepad'",
        "    menu 'File'",
        "    menu 'Edit'",
    ]
    assert a11y_text(tree, max_lines=2).splitlines()[-1] == "… (more elements not shown)"


# --- UI-TARS ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "size", "raw", "expected", "sent"),
    [
        ("ui-tars-1.5", (1280, 800), "Thought: Open File.\nAction: click(start_box='(644,406)')",
         p.Click(type="click", target=(640, 400)), (1288, 812)),
        ("ui-tars", (1920, 1080), "Thought: x\nAction: click(start_box='(500,500)')",
         p.Click(type="click", target=(960, 540)), (1280, 720)),
        ("ui-tars", (1920, 1080),
         "Thought: x\nAction: left_double(start_box='<|box_start|>(100,200)<|box_end|>')",
         p.Click(type="double_click", target=(192, 216)), (1280, 720)),
        ("ui-tars-1.5", (1280, 800), "Action: right_single(point='<point>644 406</point>')",
         p.Click(type="right_click", target=(640, 400)), (1288, 812)),
        ("ui-tars", (1000, 1000),
         "Action: drag(start_box='(100,100)', end_box='(300,400)')",
         p.Drag(start=(100, 100), end=(300, 400)), (1000, 1000)),
        ("ui-tars-1.5", (1280, 800), "Thought: save\nAction: hotkey(key='ctrl s')",
         p.PressKey(keys="ctrl+s"), (1288, 812)),
        ("ui-tars-1.5", (1280, 800), "Action: type(content='it\\'s done\\n')",
         p.TypeText(text="it's done\n"), (1288, 812)),
        ("ui-tars-1.5", (1280, 800), "Action: type(content='it's done')",
         p.TypeText(text="it's done"), (1288, 812)),
        ("ui-tars", (1000, 1000), "Action: scroll(start_box='(500,500)', direction='down')",
         p.Scroll(direction="down", amount=5, target=(500, 500)), (1000, 1000)),
        ("ui-tars-1.5", (1280, 800), "Action: wait()", p.Wait(seconds=5), (1288, 812)),
        ("ui-tars-1.5", (1280, 800), "Thought: all good\nAction: finished(content='saved')",
         p.Done(summary="saved"), (1288, 812)),
        ("ui-tars", (1280, 800), "Action: call_user()",
         p.Fail(reason="the model asked for a person's help (call_user)"), (1280, 800)),
    ],
)  # fmt: skip
async def test_ui_tars_actions_and_conventions(
    fake_model: FakeModelServer, family, size, raw, expected, sent
):
    fake_model.script([raw])
    async with model(fake_model) as chat:
        planner = UiTarsPlanner(chat, family=family)
        decision = await planner.decide(observe(size), [])
    assert decision.action == expected
    assert planner.grounds_itself
    (request,) = fake_model.requests
    assert request.image_sizes == [sent]
    assert "## Action Space" in request.text and f"## User Instruction\n{TASK}" in request.text


async def test_ui_tars_thought_is_kept(fake_model: FakeModelServer):
    fake_model.script(
        ["Thought: The File menu is at the top left.\nAction: click(start_box='(10,10)')"]
    )
    async with model(fake_model) as chat:
        decision = await UiTarsPlanner(chat, family="ui-tars").decide(observe(), [])
    assert decision.thought == "The File menu is at the top left."


async def test_ui_tars_unusable_answers_are_asked_again(fake_model: FakeModelServer):
    fake_model.script([
        "I think I should click File",
        "Action: click(start_box='(1500,20)')",
        "Action: jump(start_box='(1,1)')",
        "Action: click(start_box='(10,20)')",
    ])  # fmt: skip
    async with model(fake_model) as chat:
        planner = UiTarsPlanner(chat, family="ui-tars", max_parse_retries=3)
        decision = await planner.decide(observe((1000, 1000)), [])
    assert decision.action == p.Click(type="click", target=(10, 20))
    problems = [call.error for call in decision.calls[:3]]
    assert "no 'Action: ...' line" in (problems[0] or "")
    assert "not a point on the screen" in (problems[1] or "")
    assert "not one of the actions" in (problems[2] or "")


def test_ui_tars_needs_a_ui_tars_family():
    with pytest.raises(InvalidRequest, match=r"ui-tars, ui-tars-1\.5"):
        UiTarsPlanner(ChatModel("m", "http://127.0.0.1:9/v1"), family="uground")


# --- settings --------------------------------------------------------------------------------


def test_settings_layers_flags_over_env_over_file(tmp_path: Path):
    config = tmp_path / "agent.toml"
    config.write_text(
        'base_url = "http://file/v1"\napi_key = "file-key"\n'
        '[planner]\nmodel = "file-model"\n[limits]\nmax_steps = 7\nmax_wall_s = 60\n'
    )
    env = {"OPENAI_BASE_URL": "http://env/v1", "CUBICLE_PLANNER_MODEL": "env-model"}
    settings = load_settings({"planner.model": "flag-model", "limits.max_steps": None},
                             config=config, env=env)  # fmt: skip
    assert settings.base_url == "http://env/v1" and settings.api_key == "file-key"
    assert settings.planner.model == "flag-model"
    assert settings.limits.max_steps == 7 and settings.limits.max_wall_s == 60


def test_settings_guess_roles_from_model_names():
    qwen = load_settings({"base_url": "http://m/v1", "planner.model": "Qwen2.5-VL-7B"},
                         env={}).resolve()  # fmt: skip
    assert (qwen.planner.kind, qwen.planner.family) == ("json", "qwen2.5-vl")
    assert qwen.grounder.spec == "a11y,ocr,vlm" and qwen.grounder.model == "Qwen2.5-VL-7B"
    assert qwen.grounder.family == "qwen2.5-vl"
    env = {"CUBICLE_PLANNER_MODEL": "ByteDance-Seed/UI-TARS-1.5-7B"}
    tars = load_settings({"base_url": "http://m/v1"}, env=env).resolve()
    assert (tars.planner.kind, tars.planner.family, tars.grounder.spec) == (
        "ui-tars",
        "ui-tars-1.5",
        None,
    )
    gpt = load_settings({"base_url": "http://m/v1", "planner.model": "gpt-4o",
                         "grounder.spec": "a11y"}, env={}).resolve()  # fmt: skip
    assert (gpt.planner.family, gpt.grounder.spec) == ("generic", "a11y")


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        ({"base_url": "http://m/v1"}, "no planner model: pass --model"),
        ({"planner.model": "m"}, "no model endpoint: pass --model-url"),
        ({"planner.model": "m", "base_url": "u", "planner.kind": "ui-tars"},
         "cannot tell which UI-TARS version"),
    ],
)  # fmt: skip
def test_settings_say_what_is_missing(flags: dict, problem: str):
    with pytest.raises(InvalidRequest, match=problem):
        load_settings(flags, env={}).resolve()


def test_settings_refuse_bad_files_and_values(tmp_path: Path):
    broken = tmp_path / "broken.toml"
    broken.write_text("base_url = ")
    with pytest.raises(InvalidRequest, match="not valid TOML"):
        load_settings(config=broken, env={})
    with pytest.raises(InvalidRequest, match="does not exist"):
        load_settings(config=tmp_path / "missing.toml", env={})
    with pytest.raises(InvalidRequest, match=r"limits\.max_steps"):
        load_settings({"limits.max_steps": 0}, env={})
    with pytest.raises(InvalidRequest, match=r"planner\.colour"):
        load_settings({"planner.colour": "red"}, env={})
