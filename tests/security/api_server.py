"""`python3 api_server.py CERT KEY LOG`: "an API on the internet" for the secrets tests.

HTTPS on port 443 (the certificate the test's own CA issued for *.cubicle.test) and plain
HTTP on port 80, on every address of the namespace. Each request is one JSON line in LOG:
the address it arrived at, its Host, path, and headers, so the test sees what reached the
server. Answers carry no header value back: only what the desktop may see.
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    cert, key, log_path = sys.argv[1:4]
    log = open(log_path, "a")  # noqa: SIM115 - written until the process is killed
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            entry = {
                "arrived_at": self.connection.getsockname()[0],
                "tls": isinstance(self.connection, ssl.SSLSocket),
                "host": self.headers.get("Host"),
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": len(body),
            }
            with lock:
                log.write(json.dumps(entry) + "\n")
                log.flush()
            reply = f"ok {self.command} {self.path} auth={'authorization' in self.headers}\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply.encode())

        do_GET = do_POST = _answer

        def log_message(self, *_args) -> None:
            pass

    plain = ThreadingHTTPServer(("0.0.0.0", 80), Handler)
    secure = ThreadingHTTPServer(("0.0.0.0", 443), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    print(json.dumps({"ready": [80, 443]}), flush=True)
    log.write(json.dumps({"ready": True}) + "\n")
    log.flush()
    secure.serve_forever()


if __name__ == "__main__":
    main()
