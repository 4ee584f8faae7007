"""A TCP relay in front of a real Redis, one upstream connection per client, closed with it (a CLIENT
KILL closes the client's). It can hold back the server's answers: what a client sends reaches the
server, and runs, at once; what the server answers waits while answers are held. An answer lost to
the client's timeout after the server did the work, with no timing left to chance."""

from __future__ import annotations

import select
import socket
import threading
from typing import Self


class Relay:
    """127.0.0.1:<port> forwards to the Redis at `target_port`."""

    scheme = "redis"

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.port = self.listening.getsockname()[1]
        self.accepted = 0  # client connections carried
        self.closed = 0  # of those, closed
        self._lock = threading.Lock()
        self._answering = threading.Event()
        self._answering.set()
        self._let_through = 0  # bytes of answers still passed on while they are held
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/0"

    def hold_answers(self, after: int = 0) -> None:
        """From now on the server's answers wait (those to a client that hangs up meanwhile are dropped),
        but for their first `after` bytes: an answer cut short, its rest held."""
        self._let_through = after
        self._answering.clear()

    def release_answers(self) -> None:
        self._answering.set()

    def close(self) -> None:
        self._closed.set()
        self.listening.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listening.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            client = self._opened(client)
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:  # a failed handshake, or the server is gone: the client sees its connection close
            client.close()
            return
        with self._lock:
            self.accepted += 1
        try:
            self._pump(client, upstream)
        except OSError:
            pass  # either side reset its connection: so does the relay, on both
        finally:
            for end in (client, upstream):
                end.close()
            with self._lock:
                self.closed += 1

    def _opened(self, client: socket.socket) -> socket.socket:
        """The client's end as the relay talks to it (TlsProxy: after the TLS handshake)."""
        return client

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Bytes both ways until either side hangs up, the server's answers kept while they are held."""
        held = bytearray()
        while not self._closed.is_set():
            if held and self._answering.is_set():
                client.sendall(held)
                held.clear()
            for source in select.select([client, upstream], [], [], 0.02)[0]:
                data = source.recv(65536)
                if not data:
                    return
                if source is client:
                    upstream.sendall(data)
                elif self._answering.is_set() and not held:
                    client.sendall(data)
                else:
                    passed, self._let_through = data[:self._let_through], max(0, self._let_through - len(data))
                    client.sendall(passed)
                    held += data[len(passed):]
