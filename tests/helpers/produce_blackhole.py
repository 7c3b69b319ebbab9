"""A TCP proxy in front of a broker that can lose produce requests, to play a broker that does not answer.

Clients reach the broker through the proxy (start the broker with
``advertised_port`` = the proxy's port). While :meth:`ProduceBlackhole.cut` is
on, a connection that sends a Produce request is swallowed from then on: that
request and everything after it in both directions are dropped and the
connection stays open, so the client waits for its request timeout and tries
again on a new connection (lost too, while the cut lasts). Fetches, group
requests and metadata pass, so only producers are affected.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

_PRODUCE = 0  # Kafka API key of a Produce request


class ProduceBlackhole:
    def __init__(self, broker_port: int, host: str = "127.0.0.1", port: int = 0) -> None:
        """``port``: where to listen (0: a free port); never cut, the proxy only forwards."""
        self._target = (host, broker_port)
        self._server = socket.create_server((host, port))
        self.port = self._server.getsockname()[1]
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self.swallowed = 0  # produce requests dropped
        threading.Thread(target=self._accept, name="blackhole-accept", daemon=True).start()

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        """New produce requests pass again (connections already swallowed stay silent)."""
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        for s in [self._server, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
                broker = socket.create_connection(self._target)
            except OSError:
                return
            self._sockets += [client, broker]
            swallowed = threading.Event()
            threading.Thread(target=self._requests, args=(client, broker, swallowed), daemon=True).start()
            threading.Thread(target=self._responses, args=(broker, client, swallowed), daemon=True).start()

    def _requests(self, src: socket.socket, dst: socket.socket, swallowed: threading.Event) -> None:
        try:
            self._pump_requests(src, dst, swallowed)
        finally:
            for s in (src, dst):  # one side ended: end the other, so its pump ends too
                with contextlib.suppress(OSError):
                    s.close()

    def _pump_requests(self, src: socket.socket, dst: socket.socket, swallowed: threading.Event) -> None:
        buf = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            while len(buf) >= 6:  # int32 size, then int16 api key
                size, api_key = struct.unpack(">ih", buf[:6])
                if len(buf) < 4 + size:
                    break
                frame, buf = buf[:4 + size], buf[4 + size:]
                if api_key == _PRODUCE and self._cut.is_set() and not swallowed.is_set():
                    swallowed.set()
                if swallowed.is_set():
                    if api_key == _PRODUCE:
                        self.swallowed += 1
                    continue
                try:
                    dst.sendall(frame)
                except OSError:
                    return

    @staticmethod
    def _responses(src: socket.socket, dst: socket.socket, swallowed: threading.Event) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    return
                if not swallowed.is_set():
                    dst.sendall(data)
        except OSError:
            return
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()
