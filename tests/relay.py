"""A loopback TCP relay in front of a real server, that can break a connection at a chosen moment
(what a client sees when the server, or its node, goes away mid-conversation)."""

from __future__ import annotations

import asyncio
import socket
import ssl
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


class Gate:
    """A TLS front for a plain-HTTP server on loopback that can cut it off: ``away()`` closes the
    open connections and refuses new ones (what a client sees when the server's network is gone),
    ``back()`` lets them in again, while the server behind keeps its state.

    TLS ends here, in asyncio's TLS (one thread, a proper close_notify on every close), because
    moto's server (werkzeug) closes each TLS connection without one, which pgBackRest's OpenSSL 3
    reports as "TLS error ... unexpected eof while reading" and retries until it gives up.
    """

    def __init__(self, target: tuple[str, int], tls: ssl.SSLContext) -> None:
        self.target = target
        self.open = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(tls, started), daemon=True).start()
        started.wait(10)

    def _run(self, tls: ssl.SSLContext, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls))
        self.port = self._server.sockets[0].getsockname()[1]
        started.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def away(self) -> None:
        def cut() -> None:
            self.open = False
            for writer in list(self._writers):
                writer.transport.abort()
            self._writers.clear()

        self._loop.call_soon_threadsafe(cut)

    def back(self) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "open", True)

    def close(self) -> None:
        self.away()
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
