"""Runs inside a desktop: asks Chromium's DevTools endpoint on the desktop's own loopback.

Not imported by Cubicle: `cubicle.evals.chrome` sends this file's text to the desktop's
Python (the service's virtualenv: the standard library and `websockets`), as
`python - PORT COMMAND [ARGS...]`, and reads the JSON it prints.

    version                 the browser's version info
    tabs                    every page: id, title, url, whether it is the visible one
    page ID                 one page's title, url, text (innerText) and html
    open URL...             a new tab per URL (the last one ends up in front)
    activate ID / close ID
"""

import json
import sys
import urllib.parse
import urllib.request

PORT = int(sys.argv[1])
COMMAND = sys.argv[2]
ARGS = sys.argv[3:]


def http(path, method="GET"):
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        body = response.read()
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def evaluate(target, expression):
    from websockets.sync.client import connect

    with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=5) as ws:
        params = {"expression": expression, "returnByValue": True}
        ws.send(json.dumps({"id": 1, "method": "Runtime.evaluate", "params": params}))
        while True:
            message = json.loads(ws.recv(timeout=10))
            if message.get("id") == 1:
                return message.get("result", {}).get("result", {}).get("value")


def pages():
    return [t for t in http("/json/list") if t.get("type") == "page"]


def main():
    if COMMAND == "version":
        return http("/json/version")
    if COMMAND == "tabs":
        found = []
        for target in pages():
            state = evaluate(target, "document.visibilityState")
            found.append(
                {
                    "id": target["id"],
                    "title": target.get("title", ""),
                    "url": target.get("url", ""),
                    "visible": state == "visible",
                }
            )
        return found
    if COMMAND == "page":
        target = next((t for t in pages() if t["id"] == ARGS[0]), None)
        if target is None:
            return None
        script = (
            "JSON.stringify({title: document.title, url: location.href,"
            " text: document.body ? document.body.innerText : '',"
            " html: document.documentElement.outerHTML})"
        )
        return json.loads(evaluate(target, script))
    if COMMAND == "open":
        return [http("/json/new?" + urllib.parse.quote(url, safe=""), "PUT") for url in ARGS]
    if COMMAND in ("activate", "close"):
        return http(f"/json/{COMMAND}/{ARGS[0]}")
    raise SystemExit(f"unknown command {COMMAND!r}")


print(json.dumps(main()))
