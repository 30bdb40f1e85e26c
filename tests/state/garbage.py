"""A TCP relay in front of a real redis-server that, once told, answers every command
with one fixed reply (an error, or ``+OK`` to everything): a store that answers, wrongly."""

from __future__ import annotations

import contextlib
import socket
import threading


def take_command(buf: bytes) -> int | None:
    """Length of the first complete RESP command in ``buf`` (an array of bulk strings)."""
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    if not buf.startswith(b"*"):
        return end + 2  # an inline command: one line
    pos = end + 2
    for _ in range(int(buf[1:end])):
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        pos = eol + 2 + int(buf[pos + 1 : eol]) + 2
        if pos > len(buf):
            return None
    return pos


class GarbageRelay:
    def __init__(self, upstream_port: int, reply: bytes | None = None) -> None:
        self.upstream_port = upstream_port
        #: None: relay to redis; bytes: answer each command with this, relay nothing
        self.reply = reply
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = [self._listener]
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _spawn(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(t)
        t.start()

    def _keep(self, s: socket.socket) -> None:
        with self._lock:
            self._sockets.append(s)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._keep(client)
            self._keep(upstream)
            self._spawn(self._from_client, client, upstream)
            self._spawn(self._from_upstream, upstream, client)

    def _from_client(self, client: socket.socket, upstream: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = client.recv(65536)
            except OSError:
                return
            if not data:
                return
            reply = self.reply
            try:
                if reply is None:
                    upstream.sendall(data)  # commands are never in flight when a test flips the mode
                    continue
                buf += data
                while (n := take_command(buf)) is not None:
                    buf = buf[n:]
                    client.sendall(reply)
            except OSError:
                return

    def _from_upstream(self, upstream: socket.socket, client: socket.socket) -> None:
        while True:
            try:
                data = upstream.recv(65536)
                if not data:
                    return
                client.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
            threads, self._threads = self._threads, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in threads:
            t.join(timeout=5)
