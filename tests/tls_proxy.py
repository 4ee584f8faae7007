"""TLS in front of a real Redis, as a managed service offers it (rediss://): a local proxy that ends TLS
and passes the bytes on, so that any server binary serves TLS clients. The certificate is a
self-signed one for 127.0.0.1 (tests/fixtures/tls); clients are told not to check it."""

from __future__ import annotations

import select
import socket
import ssl
import threading
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tls"


class TlsProxy:
    """127.0.0.1:<port> speaks TLS and forwards to the plain Redis at `target_port`; each client
    connection has its own connection to Redis, closed with it (a CLIENT KILL closes the client's)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(FIXTURES / "cert.pem", FIXTURES / "key.pem")
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.port = self.listening.getsockname()[1]
        self.accepted = 0  # TLS connections made
        self.closed = 0  # of those, closed
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listening.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            secured = self.context.wrap_socket(client, server_side=True)
        except (ssl.SSLError, OSError):
            client.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:  # the server is gone (stopped at the test's end): the client sees its connection close
            secured.close()
            return
        with self._lock:
            self.accepted += 1
        try:
            self._pump(secured, upstream)
        finally:
            for end in (upstream, secured):
                end.close()
            with self._lock:
                self.closed += 1

    @staticmethod
    def _pump(secured: ssl.SSLSocket, upstream: socket.socket) -> None:
        """Bytes both ways on one thread (an SSL socket is not for two threads at once), until either
        side closes. Decrypted bytes already read wait in the SSL socket, where select cannot see them."""
        try:
            while True:
                ready = [secured] if secured.pending() else select.select([secured, upstream], [], [])[0]
                for source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    (upstream if source is secured else secured).sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self.listening.close()
