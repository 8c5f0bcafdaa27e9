"""The evaluations' branch of Cubicle's error tree (the root lives in `cubicle.protocol.errors`).

    CubicleError
    ├── InvalidRequest
    │   └── SuiteError            a suite or task file cannot be read as OSWorld tasks (422)
    ├── NotFound
    │   └── EvalRunNotFound       no such evaluation run (404)
    └── EvalError                 a task could not be set up or checked (scored `error`)
        ├── SetupFailed           a setup step (`config[]`, `postconfig`) failed
        └── CheckerError          a result getter or metric could not run

A task the agent attempted but did not finish is never an error: the checker scores it.
`EvalError` is kept for what went wrong around the agent, so a report tells a broken task
from a failed one.
"""

from __future__ import annotations

from cubicle import CubicleError, InvalidRequest, NotFound


class SuiteError(InvalidRequest):
    """A suite or one of its task files is not OSWorld-format JSON Cubicle can read."""

    code = "suite_error"


class EvalRunNotFound(NotFound):
    """No evaluation run with this id."""

    code = "eval_run_not_found"


class EvalError(CubicleError):
    """Root of what can go wrong around a task's agent run."""

    code = "eval_error"


class SetupFailed(EvalError):
    """A setup step failed; the message names the step and why."""

    code = "setup_failed"


class CheckerError(EvalError):
    """A result getter or a metric could not run (not: the task was not done)."""

    code = "checker_error"
