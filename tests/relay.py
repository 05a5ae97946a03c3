"""A loopback TCP relay in front of a real server, that can break a connection at a chosen moment
(what a client sees when the server, or its node, goes away mid-conversation)."""

from __future__ import annotations

import socket
import threading


class BreakingRelay:
    """Relays loopback TCP to a server; ``break_next()`` makes the next request go unanswered."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._break = threading.Event()
        self.broken = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def break_next(self) -> None:
        self._break.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if requests and self._break.is_set():
                    self._break.clear()
                    self.broken += 1
                    break  # the request is read and dropped: no answer, the connection closes
                dst.sendall(data)
        except OSError:
            pass
        close_both(src, dst)

    def close(self) -> None:
        self.listener.close()


def close_both(*sockets: socket.socket) -> None:
    """End a relayed connection on both sides (the peer sees it closed, not hanging)."""
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
