"""The run's numbers against values worked out by hand: Wilson intervals, pass@k, and a
summary that leaves unsupported tasks out and counts errors as not passed."""

from __future__ import annotations

import pytest

from cubicle.protocol.evals import EvalItem
from cubicle.server.evals.stats import pass_at_k, summarize, wilson

pytestmark = pytest.mark.fast


def test_wilson_interval_matches_the_textbook_values():
    low, high = wilson(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    low, high = wilson(0, 4)
    assert low == 0.0 and round(high, 4) == 0.4899
    assert wilson(4, 4)[1] == 1.0
    assert wilson(0, 0) is None


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(2, 1, 1, 0.5), (2, 1, 2, 1.0), (5, 0, 3, 0.0), (10, 3, 5, 1 - 21 / 252), (3, 3, 1, 1.0)],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def _item(task: str, attempt: int, status: str, score: float | None = None) -> EvalItem:
    return EvalItem(
        run_id="r", task_id=task, attempt=attempt, domain="d", status=status, score=score
    )  # type: ignore[arg-type]


def test_a_summary_leaves_unsupported_out_and_counts_errors_as_not_passed():
    items = [
        _item("a", 1, "passed", 1.0),
        _item("a", 2, "failed", 0.0),
        _item("b", 1, "error"),
        _item("b", 2, "failed", 0.5),
        _item("c", 1, "unsupported"),
        _item("d", 1, "passed", 1.0),
        _item("d", 2, "pending"),
    ]
    summary = summarize(items, attempts=2)
    assert (summary.tasks, summary.scored, summary.passed) == (4, 5, 2)
    assert (summary.failed, summary.errors, summary.unsupported, summary.pending) == (2, 1, 1, 1)
    assert summary.rate == pytest.approx(2 / 5)
    assert summary.mean_score == pytest.approx(2.5 / 5)
    # Only a and b have both attempts scored: pass@1 = (1/2 + 0) / 2, pass@2 = (1 + 0) / 2.
    assert summary.pass_at == {1: pytest.approx(0.25), 2: pytest.approx(0.5)}
