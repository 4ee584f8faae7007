"""TLS in front of a real Redis, as a managed service offers it (rediss://): a local proxy that ends TLS
and passes the bytes on, so that any server binary serves TLS clients. The certificate is a
self-signed one for 127.0.0.1 (tests/fixtures/tls); clients are told not to check it."""

from __future__ import annotations

import select
import socket
import ssl
from pathlib import Path

from tests.relay import Relay

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tls"


class TlsProxy(Relay):
    """127.0.0.1:<port> speaks TLS and forwards to the plain Redis at `target_port` (`accepted`: TLS
    connections made, `closed`: of those, closed)."""

    scheme = "rediss"

    def __init__(self, target_port: int) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(FIXTURES / "cert.pem", FIXTURES / "key.pem")
        super().__init__(target_port)

    def _opened(self, client: socket.socket) -> socket.socket:
        return self.context.wrap_socket(client, server_side=True)

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Bytes both ways on one thread (an SSL socket is not for two threads at once), until either
        side closes. Decrypted bytes already read wait in the SSL socket, where select cannot see them."""
        while True:
            ready = [client] if client.pending() else select.select([client, upstream], [], [])[0]
            for source in ready:
                data = source.recv(65536)
                if not data:
                    return
                (upstream if source is client else client).sendall(data)
