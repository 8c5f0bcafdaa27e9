"""`python3 listener.py PORT`: accept TCP and UDP on every address, print one JSON line
per arrival with the address it arrived at (the egress tests read which got through)."""

from __future__ import annotations

import json
import selectors
import socket
import sys

IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux's number; Python 3.11 lacks the name


def main() -> None:
    port = int(sys.argv[1])
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", port))
    tcp.listen(64)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    udp.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    chooser = selectors.DefaultSelector()
    chooser.register(tcp, selectors.EVENT_READ)
    chooser.register(udp, selectors.EVENT_READ)
    print(json.dumps({"ready": port}), flush=True)
    while True:
        for key, _ in chooser.select():
            if key.fileobj is tcp:
                client, peer = tcp.accept()
                print(json.dumps({"tcp": client.getsockname()[0], "from": peer[0]}), flush=True)
                client.close()
            else:
                _, ancillary, _, peer = udp.recvmsg(2048, 256)
                for level, kind, data in ancillary:
                    if level == socket.IPPROTO_IP and kind == IP_PKTINFO:
                        to = socket.inet_ntoa(data[8:12])
                        print(json.dumps({"udp": to, "from": peer[0]}), flush=True)


if __name__ == "__main__":
    main()
