"""A TCP proxy the tests can cut, or freeze, to make a real server unreachable.

``cut()`` resets every connection (a server that went away).  ``freeze()``
stops the bytes and keeps the sockets open (a half-open connection: a NAT
entry dropped, a failover behind a load balancer), which no error reveals.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.services import free_port


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; ``cut()`` refuses and drops every connection,
    ``freeze()`` stops forwarding bytes while every socket stays open."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        #: One event per connection: set while its bytes flow.
        self._flows: list[threading.Event] = []
        self._freeze_new = False

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def cut(self) -> None:
        """Stop listening and reset every open connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # close() alone does not wake a thread blocked in accept(); shutdown() does.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
            flows, self._flows = self._flows, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for flow in flows:
            flow.set()  # a frozen pipe wakes, finds its socket closed, and ends

    def freeze(self, new_connections: bool = True) -> None:
        """Stop forwarding on every open connection (bytes read are held, never sent);
        with ``new_connections`` also on the connections accepted from now on, else
        those flow (only the old connections are half-open)."""
        with self._lock:
            self._freeze_new = new_connections
            for flow in self._flows:
                flow.clear()

    def thaw(self) -> None:
        """Forward again, the held bytes first."""
        with self._lock:
            self._freeze_new = False
            for flow in self._flows:
                flow.set()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            # The timeout was for connecting: an idle connection (a Redis subscriber, a
            # BRPOP between messages) must not be dropped by the proxy after 5 s.
            upstream.settimeout(None)
            flow = threading.Event()
            with self._lock:
                self._sockets.update((client, upstream))
                self._flows.append(flow)
                if not self._freeze_new:
                    flow.set()
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, flow), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, flow: threading.Event) -> None:
        try:
            while data := source.recv(65536):
                flow.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
