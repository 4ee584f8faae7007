"""python -m bench.asgi_server PORT [WORKERS]: uvicorn with WORKERS (2) workers serving project.asgi on 127.0.0.1:PORT, its
listening socket made here with TCP_NODELAY, which Linux passes on to the sockets it accepts.

Why: uvicorn (h11 here: no httptools) sends a response's head and body in two writes; without
TCP_NODELAY the body waits for the client's delayed ACK (about 40 ms), which capped every ASGI row
at about 25 requests/s per keep-alive connection, whatever ran in the view.
"""

from __future__ import annotations

import socket
import sys

import uvicorn

if __name__ == "__main__":  # uvicorn's workers import this module again: only the parent binds
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listening.bind(("127.0.0.1", int(sys.argv[1])))
    listening.listen(2048)
    listening.set_inheritable(True)
    uvicorn.run("project.asgi:application", fd=listening.fileno(), workers=int(sys.argv[2]) if len(sys.argv) > 2 else 2, log_level="warning", access_log=False)
