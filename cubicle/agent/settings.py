"""The agent's model profile and run limits: from CLI flags, the environment, a TOML file.

Later sources win: defaults < the config file < environment < command-line flags; the
layering is pydantic-settings' own (`AgentSettings.settings_customise_sources`).

- File: `--config PATH`, else `CUBICLE_AGENT_CONFIG`, else `$XDG_CONFIG_HOME/cubicle/agent.toml`
  when it exists. Same keys as `AgentSettings`, sections per role:

      base_url = "http://localhost:8001/v1"
      api_key = "EMPTY"
      [planner]
      model = "qwen2.5-vl-7b"
      [grounder]
      spec = "a11y,ocr,vlm"
      model = "ui-tars-1.5-7b"
      family = "ui-tars-1.5"
      [limits]
      max_steps = 30

- Environment: `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `CUBICLE_PLANNER_MODEL`,
  `CUBICLE_GROUNDER` (spec), `CUBICLE_GROUNDER_MODEL`, `CUBICLE_GROUNDER_FAMILY`.

`resolve()` fills what is left open (the planner kind and families guessed from model
names) and says what is missing.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from cubicle.protocol.board import PlannerKind
from cubicle.protocol.errors import InvalidRequest

TOOL_KINDS = ("anthropic", "openai-computer")
"""Planners that speak a vendor's computer tool: the endpoint is the vendor's API (its
client's default when unset), and they ground themselves."""
UI_TARS_FAMILIES = ("ui-tars", "ui-tars-1.5")
"""Families whose models plan in UI-TARS's own action language."""

_ENV = {
    "OPENAI_BASE_URL": ("base_url",),
    "OPENAI_API_KEY": ("api_key",),
    "CUBICLE_PLANNER_MODEL": ("planner", "model"),
    "CUBICLE_GROUNDER": ("grounder", "spec"),
    "CUBICLE_GROUNDER_MODEL": ("grounder", "model"),
    "CUBICLE_GROUNDER_FAMILY": ("grounder", "family"),
}
"""Environment variable → the setting it sets."""

_FAMILY_HINTS = (
    ("ui-tars-1.5", "ui-tars-1.5"),
    ("ui_tars_1.5", "ui-tars-1.5"),
    ("ui-tars", "ui-tars"),
    ("ui_tars", "ui-tars"),
    ("os-atlas", "os-atlas"),
    ("showui", "showui"),
    ("uground", "uground"),
    ("qwen2.5-vl", "qwen2.5-vl"),
    ("qwen2_5_vl", "qwen2.5-vl"),
)
"""Substrings of model names (lower-cased) → their grounding family, first match wins."""


def family_for_model(model: str) -> str:
    """The grounding family a model name suggests ("generic" when none does):
    "bytedance/UI-TARS-1.5-7B" → "ui-tars-1.5", "qwen2.5-vl-7b" → "qwen2.5-vl"."""
    name = model.lower()
    return next((family for hint, family in _FAMILY_HINTS if hint in name), "generic")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlannerSettings(_Section):
    model: str | None = None
    """The model name the endpoint serves."""
    kind: PlannerKind | None = None
    """`json` (any vision chat model, elements by description), `ui-tars` (the model
    grounds itself), `anthropic` (Claude's computer tool, Messages API) or `openai-computer`
    (OpenAI's computer tool, Responses API); None: `ui-tars` for UI-TARS models, else `json`."""
    family: str | None = None
    """Frame of points in answers and the image size sent; None: guessed from the name."""
    base_url: str | None = None
    """This role's endpoint, when it differs from the shared `base_url`."""
    api_key: str | None = None
    computer_tool: Literal["computer_20250124", "computer_20251124"] = "computer_20251124"
    """For `anthropic`: the computer tool version (20251124 adds zoom)."""
    max_tokens: Annotated[int, Field(ge=256, le=128_000)] = 4096
    """For `anthropic` and `openai-computer`: the longest answer asked for, tokens."""


class GrounderSettings(_Section):
    spec: str | None = None
    """Grounders tried in order, e.g. "a11y,ocr,vlm"; None: "a11y,ocr,vlm", or none at
    all when the planner grounds itself."""
    model: str | None = None
    """The grounding model of `vlm`; None: the planner's model."""
    family: str | None = None
    """The `vlm` model's family; None: guessed from the model name."""
    base_url: str | None = None
    api_key: str | None = None


class RunLimits(_Section):
    """Caps and pacing of one run."""

    max_steps: Annotated[int, Field(ge=1, le=999)] = 30
    max_wall_s: Annotated[float, Field(gt=0, le=86_400)] = 900.0
    """Seconds the whole run may take."""
    max_consecutive_errors: Annotated[int, Field(ge=1, le=100)] = 3
    """Steps in a row that may fail before the run gives up."""
    history_screenshots: Annotated[int, Field(ge=0, le=50)] = 2
    """Earlier screenshots shown to the planner besides the current one (all text is kept)."""
    settle_quiet_ms: Annotated[int, Field(ge=10, le=10_000)] = 150
    """Milliseconds without a screen change that count as settled after an action."""
    settle_idle_ms: Annotated[int, Field(ge=10, le=10_000)] | None = 50
    """Settled sooner: this long without drawing while the desktop's programs are idle (no
    CPU wanted); None waits the whole `settle_quiet_ms` after every action."""
    settle_timeout_ms: Annotated[int, Field(ge=10, le=60_000)] = 3_000
    """Longest wait for the screen to settle, milliseconds."""
    launch_timeout_s: Annotated[float, Field(gt=0, le=120)] = 10.0
    """Seconds to wait for a launched or opened application's window to appear."""


class AgentSettings(BaseSettings):
    """Everything one agent run needs to know: endpoint, roles, limits.

    Built directly, it takes only the values given; `load_settings` adds the config file
    and the environment beneath them.
    """

    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    base_url: str | None = None
    """The OpenAI-compatible endpoint shared by every role, usually ending in /v1."""
    api_key: str = "EMPTY"
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    """Seconds one model request may take."""
    max_retries: Annotated[int, Field(ge=0, le=10)] = 2
    """Retries of a model request after a timeout, connection error, 5xx or 429."""
    retry_backoff_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    """Seconds before the first retry; doubled for each next one."""
    max_parse_retries: Annotated[int, Field(ge=0, le=10)] = 2
    """Times an unusable planner answer is asked again, the problem fed back."""
    allow_exec: bool = False
    """Offer the planner a shell inside the desktop."""
    a11y_text: bool = False
    """Show the planner the accessibility tree as text besides the screenshot."""
    planner: PlannerSettings = PlannerSettings()
    grounder: GrounderSettings = GrounderSettings()
    limits: RunLimits = RunLimits()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    def resolve(self) -> AgentSettings:
        """These settings with every guess made; `InvalidRequest` naming what is missing."""
        planner, grounder = self.planner, self.grounder
        if not planner.model:
            raise InvalidRequest(
                "no planner model: pass --model, set CUBICLE_PLANNER_MODEL, or set "
                "[planner] model in the config file"
            )
        if planner.kind in TOOL_KINDS:  # the vendor's API unless told otherwise; no grounder
            planner = planner.model_copy(update={"family": planner.family or "generic"})
            grounder = grounder.model_copy(update={"spec": None})
            return self.model_copy(update={"planner": planner, "grounder": grounder})
        if not (planner.base_url or self.base_url):
            raise InvalidRequest(
                "no model endpoint: pass --model-url, set OPENAI_BASE_URL, or set base_url "
                "in the config file (an OpenAI-compatible URL, usually ending in /v1)"
            )
        guessed = family_for_model(planner.model)
        kind = planner.kind or ("ui-tars" if guessed in UI_TARS_FAMILIES else "json")
        family = planner.family or guessed
        if kind == "ui-tars" and family not in UI_TARS_FAMILIES:
            raise InvalidRequest(
                f"cannot tell which UI-TARS version {planner.model!r} is: set the planner "
                f"family to one of {', '.join(UI_TARS_FAMILIES)}"
            )
        planner = planner.model_copy(update={"kind": kind, "family": family})
        spec = grounder.spec or (None if kind == "ui-tars" else "a11y,ocr,vlm")
        if spec is not None:
            model = grounder.model or planner.model
            grounder = grounder.model_copy(
                update={
                    "spec": spec,
                    "model": model,
                    "family": grounder.family or family_for_model(model),
                }
            )
        return self.model_copy(update={"planner": planner, "grounder": grounder})


def _set(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


class _AgentEnvironment(PydanticBaseSettingsSource):
    """The environment variables of `_ENV`, each setting the field it names."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._env = env

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, where in _ENV.items():
            if self._env.get(name):
                _set(values, where, self._env[name])
        return values


def _layered(path: Path | None, env: Mapping[str, str]) -> type[AgentSettings]:
    """`AgentSettings` reading flags over `env` over the TOML file at `path`."""

    class Layered(AgentSettings):
        model_config = SettingsConfigDict(toml_file=path)

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            **_: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources = [init_settings, _AgentEnvironment(settings_cls, env)]
            if path is not None:
                sources.append(TomlConfigSettingsSource(settings_cls))
            return tuple(sources)

    return Layered


def config_path(explicit: Path | None, env: Mapping[str, str]) -> Path | None:
    """The config file to read: `explicit`, else `CUBICLE_AGENT_CONFIG`, else the default
    path when a file is there; None when there is none."""
    if explicit is not None:
        return explicit
    if env.get("CUBICLE_AGENT_CONFIG"):
        return Path(env["CUBICLE_AGENT_CONFIG"])
    home = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    default = home / "cubicle" / "agent.toml"
    return default if default.is_file() else None


def load_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> AgentSettings:
    """Settings from the config file, the environment and `flags`, later ones winning.

    `flags` maps dotted names to values ("planner.model": "…", "limits.max_steps": 5);
    None values are left out. `env` defaults to `os.environ`. Not resolved: call
    `resolve()` to make the guesses and check that the essentials are there.
    """
    env = os.environ if env is None else env
    path = config_path(config, env)
    if path is not None and not path.is_file():
        raise InvalidRequest(f"the agent config file {path} does not exist")
    given: dict[str, Any] = {}
    for name, value in (flags or {}).items():
        if value is not None:
            _set(given, tuple(name.split(".")), value)
    try:
        return _layered(path, env)(**given)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"the agent config file {path} is not valid TOML: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        where = f" (config file {path})" if path is not None else ""
        raise InvalidRequest(f"invalid agent settings{where}: {problems}") from exc
