"""`cubicle`: run the service, and manage desktops from a shell.

cubicle serve                      start the service, print its URL with the token
cubicle desktop create             start a desktop, print its id
cubicle desktop ls                 list desktops
cubicle desktop screenshot ID -o shot.png
cubicle desktop kill ID
cubicle run "TASK" --model-url URL --model NAME   run the agent on a fresh desktop
cubicle eval SUITE --model-url URL --model NAME   run a suite of OSWorld-format tasks
cubicle mcp                        serve MCP on stdin/stdout (for Claude Desktop and the like)
cubicle image build                build the microVM image (or say it is cached)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cubicle.protocol.errors import CubicleError

if TYPE_CHECKING:
    from cubicle.agent.steps import StepRecord
    from cubicle.client.sdk import AsyncDesktop
    from cubicle.server.ports.tls import LocalCA
    from cubicle.server.settings import Settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from cubicle.server.app import create_app
    from cubicle.server.board.room import AgentRoom  # the assembly is where the rooms meet
    from cubicle.server.evals.room import EvalRoom
    from cubicle.server.live.api import LiveRoom
    from cubicle.server.mcp import McpRoom
    from cubicle.server.ports.tls import tls_or_plain
    from cubicle.server.settings import Settings

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if args.data_dir:
        overrides["data_dir"] = Path(args.data_dir)
    settings = Settings(**overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per call to a guest is noise

    def announce(url: str) -> None:
        board = url.replace("/?token=", "/web/board.html?token=")
        print(f"\nCubicle is running: {url}\nTask board: {board}\n", flush=True)

    rooms = [LiveRoom(), AgentRoom(), McpRoom(), EvalRoom()]
    uvicorn.run(
        create_app(settings, on_ready=announce, rooms=rooms),
        host=settings.host,
        port=settings.port,
        # HTTP and HTTPS on the one port, told apart by each connection's first byte
        http=tls_or_plain(HttpToolsProtocol, _local_ca(settings).server_context()),
        server_header=False,  # a desktop's program answering through the proxy names itself
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    return 0


def _local_ca(settings: Settings) -> LocalCA:
    from cubicle.server.ports.tls import LocalCA

    hosts = () if settings.host in ("0.0.0.0", "::", "") else (settings.host,)
    return LocalCA.load_or_create(settings.data_dir / "ca", settings.port_domain_name, hosts)


def _ca(args: argparse.Namespace) -> int:
    from cubicle.server.settings import Settings

    settings = Settings(**({"data_dir": Path(args.data_dir)} if args.data_dir else {}))
    ca = _local_ca(settings).ca_pem
    domain = settings.port_domain
    print(
        f"""The service's certificate authority: {ca}

It signs the service's own certificate alone, for https://localhost:{settings.port}/ and
https://<port>-<desktop id>.{domain}/ (desktops' ports). Trust it where you open those:

  this machine:  cp {ca} /usr/local/share/ca-certificates/cubicle.crt && update-ca-certificates
  Chromium:      certutil -d sql:$HOME/.pki/nssdb -A -t C,, -n cubicle -i {ca}
  Firefox:       Settings > Privacy & Security > Certificates > Import
  Python:        SSL_CERT_FILE={ca}   (httpx: verify=ssl.create_default_context(cafile=...))
  Node.js:       NODE_EXTRA_CA_CERTS={ca}"""
    )
    return 0


def _e2b_env(args: argparse.Namespace) -> int:
    """The three exports that point E2B's SDKs at this service."""
    from cubicle.client.sdk import service_address

    url, token = service_address(args.url, args.token)
    print(
        f"export E2B_API_URL={shlex.quote(url)}\n"
        f"export E2B_SANDBOX_URL={shlex.quote(url)}\n"
        f"export E2B_API_KEY={shlex.quote(token)}"
    )
    return 0


async def _desktop(args: argparse.Namespace) -> int:
    from cubicle.client.sdk import AsyncDesktop, list_desktops

    if args.action == "create":
        width, _, height = args.resolution.partition("x")
        d = await AsyncDesktop.create(
            resolution=(int(width), int(height)), timeout_s=args.timeout, network=args.network
        )
        await d.close()
        print(d.id)
        return 0
    if args.action == "ls":
        for info in await list_desktops():
            size = f"{info.screen.width}x{info.screen.height}"
            node = f"node {info.node.address} {info.node.id[:12]}  " if info.node else ""
            print(f"{info.id}  {info.status:8}  {size:10}  {node}{info.reason or ''}")
        return 0
    d = await AsyncDesktop.connect(args.id)
    try:
        if args.action == "screenshot":
            data = await d.screenshot(args.format)
            await asyncio.to_thread(Path(args.output).write_bytes, data)
            print(f"{args.output}: {len(data)} bytes")
        elif args.action == "kill":
            await d.kill()
            print(f"killed {args.id}")
    finally:
        await d.close()
    return 0


async def _mcp(args: argparse.Namespace) -> int:
    from cubicle.mcp.server import serve_stdio
    from cubicle.mcp.session import Connection

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # stdout carries MCP
    await serve_stdio(Connection.resolve(args.url, args.token))
    return 0


def _print_step(step: StepRecord) -> None:
    where = "".join(f" → ({g.x}, {g.y}) {g.source}" for g in step.grounded)
    took = f"{step.timings.total_ms / 1000:.2f} s (model {step.timings.model_ms / 1000:.2f} s)"
    print(f"[{step.index}] {step.action_text or 'no action'}{where} · {took}", flush=True)
    if step.thought:
        print(f"    thought: {step.thought}", flush=True)
    if step.error:
        print(f"    error: {step.error}", flush=True)


async def _viewer_url(d: AsyncDesktop) -> str:
    """A view-only link to the desktop's live view, or why there is none."""
    try:
        return (await d.share("view")).url
    except CubicleError as exc:
        return f"unavailable ({exc.message})"


async def _run(args: argparse.Namespace) -> int:
    from cubicle.agent.run import run_task
    from cubicle.agent.settings import load_settings
    from cubicle.agent.store import RunStore, new_run_id
    from cubicle.client.sdk import AsyncDesktop
    from cubicle.protocol.data_dir import default_data_dir

    flags = {
        "base_url": args.model_url,
        "api_key": args.api_key,
        "timeout_s": args.model_timeout,
        "planner.model": args.model,
        "planner.kind": args.planner,
        "planner.family": args.planner_family,
        "grounder.spec": args.grounder,
        "grounder.model": args.grounder_model,
        "grounder.family": args.grounder_family,
        "grounder.base_url": args.grounder_url,
        "limits.max_steps": args.max_steps,
        "limits.max_wall_s": args.max_time,
        "allow_exec": args.allow_exec or None,
        "a11y_text": args.a11y_text or None,
    }
    config = Path(args.config) if args.config else None
    settings = load_settings(flags, config=config).resolve()
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    if args.desktop:
        d = await AsyncDesktop.connect(args.desktop)
    else:
        width, _, height = args.resolution.partition("x")
        d = await AsyncDesktop.create(resolution=(int(width), int(height)), network=args.network)
    run_id = new_run_id()
    try:
        screen = d.info.screen
        print(f"run {run_id} on desktop {d.id} ({screen.width}x{screen.height})", flush=True)
        grounder = settings.grounder.spec or "none (the planner grounds itself)"
        print(f"planner {settings.planner.kind}:{settings.planner.model}, grounder {grounder}")
        print(f"watch live: {await _viewer_url(d)}", flush=True)
        record = await run_task(
            d, args.task, settings, store=RunStore(data_dir), on_step=_print_step, run_id=run_id
        )
        print(f"record: {data_dir / 'runs' / run_id} (GET /api/runs/{run_id})")
        if record.status == "done":
            print(f"done{': ' + record.reason if record.reason else ''}", flush=True)
            return 0
        print(f"failed: {record.reason}", flush=True)
        return 1
    except asyncio.CancelledError:
        print("cancelled", flush=True)
        raise
    finally:
        if args.desktop or args.keep:
            print(f"desktop {d.id} left running", flush=True)
            await d.close()
        else:
            await d.kill()


async def _image(args: argparse.Namespace) -> int:
    from cubicle.server.runtime.microvm.image import build_image
    from cubicle.server.settings import Settings

    settings = Settings(**({"data_dir": Path(args.data_dir)} if args.data_dir else {}))
    images_dir = settings.images_dir or settings.data_dir / "images"
    image = await build_image(images_dir, progress=lambda line: print(line, flush=True))
    print(image.base)
    print(image.guest)
    return 0


_EXTRAS = {
    "serve": ("server", ("fastapi", "uvicorn", "aiortc", "pydantic_settings", "cryptography")),
    "image": ("server", ("pydantic_settings",)),
    "ca": ("server", ("pydantic_settings", "cryptography")),
    "run": ("agent", ("openai", "PIL")),
    "mcp": ("mcp", ("mcp",)),
}
"""Per command, the extra that installs it and modules it cannot run without: a bare
`pip install cubicle` is the SDK and these commands' clients only."""


def _missing(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that cannot be imported, if any."""
    import importlib.util

    return next((m for m in modules if importlib.util.find_spec(m) is None), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cubicle", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the service")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--data-dir", help="token, database and desktops (CUBICLE_DATA_DIR)")

    desktop = commands.add_parser("desktop", help="manage desktops of a running service")
    actions = desktop.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="start a desktop and print its id")
    create.add_argument("--resolution", default="1280x800", help="WIDTHxHEIGHT")
    create.add_argument("--timeout", type=int, default=600, help="idle seconds before it stops")
    create.add_argument("--network", action="store_true", help="give it a user-mode network")
    actions.add_parser("ls", help="list desktops")
    shot = actions.add_parser("screenshot", help="save a screenshot")
    shot.add_argument("id")
    shot.add_argument("-o", "--output", default="screenshot.png")
    shot.add_argument("--format", choices=["png", "jpeg", "webp"], default="png")
    kill = actions.add_parser("kill", help="stop a desktop")
    kill.add_argument("id")

    image = commands.add_parser("image", help="the microVM runtime's image")
    image.add_argument("action", choices=["build"], help="build it unless it is cached")
    image.add_argument("--data-dir", help="where images live (CUBICLE_DATA_DIR)")

    run = commands.add_parser("run", help="run the agent on a task, on a fresh desktop")
    run.add_argument("task", help="what to do, in words")
    run.add_argument("--model-url", help="OpenAI-compatible endpoint (OPENAI_BASE_URL)")
    run.add_argument("--api-key", help="its API key (OPENAI_API_KEY)")
    run.add_argument("--model", help="the planner model (CUBICLE_PLANNER_MODEL)")
    run.add_argument(
        "--planner",
        choices=["json", "ui-tars", "anthropic", "openai-computer"],
        help="planner kind (default: by name); anthropic and openai-computer use the "
        "vendor's computer tool, --model-url then being the vendor's API",
    )
    run.add_argument("--planner-family", help="frame of points in its answers (default: by name)")
    run.add_argument(
        "--grounder", help='grounders in order, e.g. "a11y,ocr,vlm" (CUBICLE_GROUNDER)'
    )
    run.add_argument("--grounder-model", help="the vlm grounder's model (default: the planner's)")
    run.add_argument("--grounder-family", help="the vlm grounder's family (default: by name)")
    run.add_argument("--grounder-url", help="the vlm grounder's endpoint, if it differs")
    run.add_argument("--config", help="agent TOML file (CUBICLE_AGENT_CONFIG)")
    run.add_argument("--max-steps", type=int, help="step cap (default 30)")
    run.add_argument("--max-time", type=float, help="wall-time cap, seconds (default 900)")
    run.add_argument("--model-timeout", type=float, help="seconds per model request")
    run.add_argument("--allow-exec", action="store_true", help="let the planner run commands")
    run.add_argument("--a11y-text", action="store_true", help="show it the a11y tree as text")
    run.add_argument("--desktop", help="use this running desktop instead of a fresh one")
    run.add_argument("--keep", action="store_true", help="leave the fresh desktop running")
    run.add_argument("--resolution", default="1280x800", help="WIDTHxHEIGHT of a fresh desktop")
    run.add_argument("--network", action="store_true", help="give a fresh desktop a network")
    run.add_argument("--data-dir", help="where runs are recorded (CUBICLE_DATA_DIR)")

    ca = commands.add_parser("ca", help="where the service's local CA is, and how to trust it")
    ca.add_argument("--data-dir", help="the service's data directory (CUBICLE_DATA_DIR)")

    e2b = commands.add_parser("e2b", help="point E2B's SDKs at this service")
    e2b_actions = e2b.add_subparsers(dest="action", required=True)
    e2b_env = e2b_actions.add_parser("env", help="print the three exports E2B's SDKs read")
    e2b_env.add_argument("--url", help="the service (CUBICLE_URL, default http://127.0.0.1:8000)")
    e2b_env.add_argument("--token", help="its token (CUBICLE_TOKEN, default the token file)")

    mcp = commands.add_parser("mcp", help="serve MCP on stdin/stdout for a running service")
    mcp.add_argument("--url", help="the service (CUBICLE_URL, default http://127.0.0.1:8000)")
    mcp.add_argument("--token", help="its token (CUBICLE_TOKEN, default the token file)")

    from cubicle.evals import cli as evals_cli  # parses nothing until `eval` runs

    evals = commands.add_parser("eval", help="run a suite of OSWorld-format tasks, print a score")
    evals_cli.configure(evals)

    args = parser.parse_args(argv)
    needs = _EXTRAS.get(args.command)
    if needs and (missing := _missing(needs[1])):
        print(
            f"cubicle {args.command}: needs {missing}, which this install lacks: "
            f"pip install 'cubicle[{needs[0]}]'",
            file=sys.stderr,
        )
        return 2
    # Runs, recordings and reports the CLI writes (some into the service's data directory)
    # are its user's alone, as the service's own files are (cubicle.server.at_rest).
    os.umask(0o077)
    try:
        if args.command == "eval":
            return evals_cli.main(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "run":
            return asyncio.run(_run(args))
        if args.command == "mcp":
            return asyncio.run(_mcp(args))
        if args.command == "image":
            return asyncio.run(_image(args))
        if args.command == "ca":
            return _ca(args)
        if args.command == "e2b":
            return _e2b_env(args)
        return asyncio.run(_desktop(args))
    except CubicleError as exc:
        print(f"cubicle: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
