"""`e2b`: E2B's own Python SDKs against a Cubicle service, beside Cubicle's SDK.

The released `e2b` and `e2b-code-interpreter` packages, pointed at the service with the
three exports (`cubicle e2b env`), and Cubicle's SDK on the same sandboxes, in one run:

- `Sandbox.create()` p50: taken from the warm pool (a service with one spare, refilled
  between creates) and cold (`CUBICLE_WARM_POOL=0`); E2B quotes ~150 ms for its own;
- `commands.run("echo hi")` p50, beside `Desktop.commands.run("echo hi")`;
- `files.write` then `files.read` of 1 MiB, beside Cubicle's `files.write`/`read`;
- `run_code("1+1")` p50 (warm context), beside `Desktop.run_code("1+1")`;
- `e2b-desktop`: `Sandbox.create()` (its own Xvfb and XFCE start attempts included),
  `left_click(x, y)` and `screenshot()` p50, beside Cubicle's `d.left_click(x, y)` and
  `d.screenshot()` on the same desktop, interleaved.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, summarize, timed
from cubicle.client.sdk import Desktop

MIB = 1 << 20


@dataclass(frozen=True)
class E2bResult:
    create_from_pool: Summary
    create_cold: Summary
    command_e2b: Summary
    command_cubicle: Summary
    file_1mib_write_read_e2b: Summary
    file_1mib_write_read_cubicle: Summary
    run_code_e2b: Summary
    run_code_cubicle: Summary
    desktop_create_e2b: Summary
    """`e2b_desktop.Sandbox.create()`, warm pool off (a 1024×768 desktop boots)."""
    desktop_click_e2b: Summary
    """`left_click(x, y)`: two `xdotool` commands through envd."""
    desktop_click_cubicle: Summary
    desktop_screenshot_e2b: Summary
    """`screenshot()`: `scrot` through envd, then the PNG read back as a file."""
    desktop_screenshot_cubicle: Summary
    targets: list[Target]


@contextmanager
def _pointed_at(service: Service) -> Iterator[None]:
    """The three exports, for the E2B SDKs in this process."""
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ.update(
        E2B_API_URL=service.url, E2B_SANDBOX_URL=service.url, E2B_API_KEY=service.token
    )
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _creates(service: Service, n: int, *, refill_s: float) -> list[float]:
    from e2b import Sandbox

    samples = []
    with _pointed_at(service):
        for _ in range(n):
            time.sleep(refill_s)  # the pool boots its next spare meanwhile
            started = time.perf_counter()
            sandbox = Sandbox.create(timeout=120)
            samples.append(time.perf_counter() - started)
            sandbox.kill()
    return samples


def _settle(service: Service) -> None:
    """Wait (at most a minute) until the pool boots nothing: a spare booting beside the
    measured calls would slow whichever ran then."""
    deadline = time.monotonic() + 60
    while service.client.get("/api/pool").json()["booting"] and time.monotonic() < deadline:
        time.sleep(0.5)


def _interleaved(
    a: Callable[[], object], b: Callable[[], object], n: int
) -> tuple[list[float], list[float]]:
    """`n` timings of each, alternating, so that the host's noise falls on both alike."""
    first: list[float] = []
    second: list[float] = []
    for _ in range(n):
        first += timed(a, 1)
        second += timed(b, 1)
    return first, second


def run(options: Options) -> E2bResult:
    from e2b_code_interpreter import Sandbox as CodeSandbox

    n = 20 if options.quick else 200
    files_n = 5 if options.quick else 20
    creates = 3 if options.quick else 10
    blob = os.urandom(MIB)
    with running_service(CUBICLE_WARM_POOL="1") as service:
        progress(f"e2b: {creates} creates from the pool")
        pooled = _creates(service, creates, refill_s=3.0)
        with _pointed_at(service):
            sandbox = CodeSandbox.create(timeout=600)
            try:
                ours = Desktop.connect(
                    sandbox.sandbox_id, base_url=service.url, token=service.token
                )
                progress(f"e2b: {n} commands each way")
                sandbox.commands.run("echo warm")
                ours.commands.run("echo warm")
                command_e2b = timed(lambda: sandbox.commands.run("echo hi"), n)
                command_ours = timed(lambda: ours.commands.run("echo hi"), n)
                progress(f"e2b: {files_n} 1 MiB files each way")

                def e2b_file() -> None:
                    sandbox.files.write("/tmp/blob.e2b", blob)
                    assert len(sandbox.files.read("/tmp/blob.e2b", format="bytes")) == MIB

                def our_file() -> None:
                    ours.files.write("/tmp/blob.ours", blob)
                    assert len(ours.files.read("/tmp/blob.ours")) == MIB

                files_e2b, files_ours = _interleaved(e2b_file, our_file, files_n)
                progress(f"e2b: {n} run_code each way, interleaved")
                sandbox.run_code("1+1")
                ours.run_code("1+1")
                code_e2b, code_ours = _interleaved(
                    lambda: sandbox.run_code("1+1"), lambda: ours.run_code("1+1"), n
                )
                ours.close()
            finally:
                sandbox.kill()
    with running_service(CUBICLE_WARM_POOL="0") as cold_service:
        progress(f"e2b: {creates} cold creates")
        cold = _creates(cold_service, creates, refill_s=0.0)
        progress(f"e2b: e2b-desktop, {creates} creates and {n // 4} clicks and screenshots")
        desktop = _e2b_desktop(cold_service, creates, max(5, n // 4))
    return E2bResult(
        create_from_pool=summarize(pooled),
        create_cold=summarize(cold),
        command_e2b=summarize(command_e2b),
        command_cubicle=summarize(command_ours),
        file_1mib_write_read_e2b=summarize(files_e2b),
        file_1mib_write_read_cubicle=summarize(files_ours),
        run_code_e2b=summarize(code_e2b),
        run_code_cubicle=summarize(code_ours),
        desktop_create_e2b=summarize(desktop["create"]),
        desktop_click_e2b=summarize(desktop["click_e2b"]),
        desktop_click_cubicle=summarize(desktop["click_ours"]),
        desktop_screenshot_e2b=summarize(desktop["shot_e2b"]),
        desktop_screenshot_cubicle=summarize(desktop["shot_ours"]),
        targets=[],
    )


def _e2b_desktop(service: Service, creates: int, n: int) -> dict[str, list[float]]:
    from e2b_desktop import Sandbox as DesktopSandbox

    found: dict[str, list[float]] = {"create": []}
    with _pointed_at(service):
        for _ in range(creates):
            started = time.perf_counter()
            sandbox = DesktopSandbox.create(timeout=300)
            found["create"].append(time.perf_counter() - started)
            if len(found["create"]) < creates:
                sandbox.kill()
        try:
            ours = Desktop.connect(sandbox.sandbox_id, base_url=service.url, token=service.token)
            spots = itertools.cycle([(200, 150), (260, 190)])
            # Each click somewhere else: the SDK's `xdotool mousemove --sync` waits for a
            # motion event, and a pointer already there makes none (about 15 s lost).
            found["click_e2b"], found["click_ours"] = _interleaved(
                lambda: sandbox.left_click(*next(spots)), lambda: ours.left_click(*next(spots)), n
            )
            found["shot_e2b"], found["shot_ours"] = _interleaved(
                sandbox.screenshot, ours.screenshot, n
            )
            ours.close()
        finally:
            sandbox.kill()
    return found
