"""Numbers of an evaluation run: success rate with its Wilson interval, pass@k, breakdowns,
and the comparison of two runs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from cubicle.protocol.evals import (
    FINAL,
    Comparison,
    DomainRow,
    EvalItem,
    EvalRun,
    Flip,
    Summary,
    TaskRow,
)

Z_95 = 1.959963984540054
"""The normal quantile of a two-sided 95 % interval."""


def wilson(passed: int, total: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval of `passed` successes in `total` trials; None for none."""
    if total <= 0:
        return None
    p = passed / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    low = 0.0 if passed == 0 else max(0.0, centre - half)
    high = 1.0 if passed == total else min(1.0, centre + half)
    return low, high


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a task tried `n` times with `c` passes: the chance that `k`
    of the tries, drawn without replacement, hold at least one pass."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} tries, not {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _by_task(items: Sequence[EvalItem]) -> dict[str, list[EvalItem]]:
    grouped: dict[str, list[EvalItem]] = defaultdict(list)
    for item in items:
        grouped[item.task_id].append(item)
    return grouped


def summarize(items: Sequence[EvalItem], attempts: int) -> Summary:
    scored = [i for i in items if i.status in FINAL and i.status != "unsupported"]
    passed = sum(i.status == "passed" for i in scored)
    interval = wilson(passed, len(scored))
    scores = [i.score or 0.0 for i in scored]
    pass_at: dict[int, float] = {}
    complete = [
        group
        for group in _by_task(items).values()
        if all(i.status in FINAL and i.status != "unsupported" for i in group)
        and len(group) == attempts
    ]
    if complete:
        for k in range(1, attempts + 1):
            values = [
                pass_at_k(attempts, sum(i.status == "passed" for i in group), k)
                for group in complete
            ]
            pass_at[k] = sum(values) / len(values)
    return Summary(
        tasks=len(_by_task(items)),
        scored=len(scored),
        passed=passed,
        failed=sum(i.status == "failed" for i in scored),
        errors=sum(i.status == "error" for i in scored),
        unsupported=len({i.task_id for i in items if i.status == "unsupported"}),
        pending=sum(i.status not in FINAL for i in items),
        rate=passed / len(scored) if scored else None,
        ci_low=interval[0] if interval else None,
        ci_high=interval[1] if interval else None,
        mean_score=sum(scores) / len(scores) if scores else None,
        pass_at=pass_at,
    )


def domains(items: Sequence[EvalItem]) -> list[DomainRow]:
    grouped: dict[str, list[EvalItem]] = defaultdict(list)
    for item in items:
        grouped[item.domain or "other"].append(item)
    rows = []
    for domain, group in sorted(grouped.items()):
        scored = [i for i in group if i.status in FINAL and i.status != "unsupported"]
        passed = sum(i.status == "passed" for i in scored)
        rows.append(
            DomainRow(
                domain=domain,
                tasks=len({i.task_id for i in group}),
                scored=len(scored),
                passed=passed,
                rate=passed / len(scored) if scored else None,
            )
        )
    return rows


def task_status(group: Sequence[EvalItem]) -> str:
    """A task's outcome over its attempts: passed if any passed, else the first's."""
    ordered = sorted(group, key=lambda i: i.attempt)
    if any(i.status == "passed" for i in ordered):
        return "passed"
    return ordered[0].status


def task_rows(
    items: Sequence[EvalItem], instructions: dict[str, str], problems: dict[str, list[str]]
) -> list[TaskRow]:
    rows = []
    for task_id, group in _by_task(items).items():
        scored = [i for i in group if i.status in FINAL and i.status != "unsupported"]
        rows.append(
            TaskRow(
                task_id=task_id,
                domain=group[0].domain,
                instruction=instructions.get(task_id, ""),
                attempts=len(scored),
                passes=sum(i.status == "passed" for i in scored),
                status=task_status(group),  # type: ignore[arg-type]
                unsupported=problems.get(task_id, []),
            )
        )
    return rows


def compare(
    a: EvalRun, a_items: Sequence[EvalItem], b: EvalRun, b_items: Sequence[EvalItem]
) -> Comparison:
    """Which tasks flipped between run `a` and run `b` (their first-attempt-or-any-pass
    outcomes), over the tasks both scored."""
    a_tasks, b_tasks = _by_task(a_items), _by_task(b_items)
    flipped, both_passed, both_failed, common = [], 0, 0, 0
    for task_id in sorted(a_tasks.keys() & b_tasks.keys()):
        a_status, b_status = task_status(a_tasks[task_id]), task_status(b_tasks[task_id])
        if a_status not in FINAL or b_status not in FINAL or "unsupported" in (a_status, b_status):
            continue
        common += 1
        a_pass, b_pass = a_status == "passed", b_status == "passed"
        if a_pass and b_pass:
            both_passed += 1
        elif not a_pass and not b_pass:
            both_failed += 1
        else:
            domain = a_tasks[task_id][0].domain
            flipped.append(Flip(task_id=task_id, domain=domain, a=a_status, b=b_status))  # type: ignore[arg-type]
    return Comparison(
        a=a,
        b=b,
        a_summary=summarize(a_items, a.attempts),
        b_summary=summarize(b_items, b.attempts),
        common=common,
        flipped=flipped,
        both_passed=both_passed,
        both_failed=both_failed,
    )
