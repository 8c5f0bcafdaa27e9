"""`cubicle`: run the service, and manage desktops from a shell.

cubicle serve                      start the service, print its URL with the token
cubicle desktop create             start a desktop, print its id
cubicle desktop ls                 list desktops
cubicle desktop screenshot ID -o shot.png
cubicle desktop kill ID
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from desktop.errors import CubicleError


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from desktop.app import create_app
    from desktop.settings import Settings

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if args.data_dir:
        overrides["data_dir"] = Path(args.data_dir)
    settings = Settings(**overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    def announce(url: str) -> None:
        print(f"\nCubicle is running: {url}\n", flush=True)

    uvicorn.run(
        create_app(settings, on_ready=announce),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    return 0


async def _desktop(args: argparse.Namespace) -> int:
    from desktop.sdk import AsyncDesktop, list_desktops

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
            print(f"{info.id}  {info.status:8}  {size:10}  {info.reason or ''}")
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

    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        return asyncio.run(_desktop(args))
    except CubicleError as exc:
        print(f"cubicle: {exc.message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
