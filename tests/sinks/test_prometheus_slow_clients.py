"""Slow clients against PrometheusEventHandler.serve()'s servers, the Rust
one (its own registry) and the Python WSGI one (``registry=`` given):
a deadline for the whole request head, scrapes served while 40 slow
clients hold connections, a bounded number of threads that close() ends,
and a forked child that holds none of the server's sockets (docs/sinks.md,
"Serving"). Real sockets on 127.0.0.1, every wait bounded."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

import pytest

from torchmon import STAT_EVENT, Event, PrometheusEventHandler

prometheus_client = pytest.importorskip("prometheus_client")

SLOW_HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000


@pytest.fixture(params=["rust", "python"])
def sink(request: pytest.FixtureRequest) -> Iterator[PrometheusEventHandler]:
    options = {} if request.param == "rust" else {"registry": prometheus_client.CollectorRegistry()}
    handler = PrometheusEventHandler.serve(port_base=0, **options)
    handler(Event(STAT_EVENT, datetime.now(), {"loss.mean": 0.25}))
    try:
        yield handler
    finally:
        handler.close()


class SlowClients:
    """``count`` connections kept open on a thread: half send one byte of an
    endless head every ``interval`` seconds, half send nothing; each one the
    server closes is opened again at once."""

    def __init__(self, port: int, count: int, interval: float = 1.0) -> None:
        self.port = port
        self.interval = interval
        self.selector = selectors.DefaultSelector()
        self.sent: dict[socket.socket, int] = {}
        self.trickling: set[socket.socket] = set()
        self.reopened = 0
        self.stopping = threading.Event()
        for index in range(count):
            self._open(trickle=index % 2 == 0)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self, trickle: bool) -> None:
        connection = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        connection.setblocking(False)
        self.sent[connection] = 0
        if trickle:
            self.trickling.add(connection)
        self.selector.register(connection, selectors.EVENT_READ)

    def _run(self) -> None:
        next_byte = time.monotonic() + self.interval
        while not self.stopping.is_set():
            for key, _ in self.selector.select(timeout=0.05):
                connection = key.fileobj
                assert isinstance(connection, socket.socket)
                try:
                    data = connection.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    trickle = connection in self.trickling
                    self.selector.unregister(connection)
                    self.trickling.discard(connection)
                    del self.sent[connection]
                    connection.close()
                    self.reopened += 1
                    self._open(trickle)
            if time.monotonic() >= next_byte:
                next_byte += self.interval
                for connection in list(self.trickling):
                    count = self.sent[connection]
                    try:
                        connection.send(SLOW_HEAD[count : count + 1])
                        self.sent[connection] = count + 1
                    except OSError:
                        pass

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        for connection in self.sent:
            connection.close()


def scrape(port: int, timeout: float = 2.0) -> str:
    """The status of one scrape, or what went wrong."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
            connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            response = b""
            while chunk := connection.recv(65536):
                response += chunk
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    except socket.timeout:  # TimeoutError from 3.10 on, not on 3.9
        return "timeout"
    return response.split(b" ", 2)[1].decode() if response else "closed"


def test_scrapes_every_100_ms_are_served_while_40_slow_clients_hold_connections(
    sink: PrometheusEventHandler,
) -> None:
    port = sink.port
    assert port is not None
    slow = SlowClients(port, 40)
    try:
        time.sleep(0.5)
        outcomes: Counter[str] = Counter()
        for _ in range(30):
            outcomes[scrape(port)] += 1
            time.sleep(0.1)
    finally:
        slow.close()
    assert outcomes["200"] >= 29, outcomes  # 95 %


def test_a_head_trickled_in_is_cut_off_at_the_head_deadline(sink: PrometheusEventHandler) -> None:
    """One byte a second renews a timeout per read for ever; the head's
    deadline (5 s) counts from the connection."""
    port = sink.port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        start = time.monotonic()
        connection.settimeout(0.1)
        response = b""
        for count in range(12):
            try:
                connection.send(SLOW_HEAD[count : count + 1])
            except OSError:
                break
            try:
                response = connection.recv(65536)
                break  # answered, or closed
            except socket.timeout:  # TimeoutError from 3.10 on, not on 3.9
                time.sleep(0.9)
        took = time.monotonic() - start
    assert response.startswith(b"HTTP/1.1 408"), response
    assert 4.0 < took < 8.0, took


def scrape_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "torchmon-prometheus-scrape"]


def test_the_python_server_bounds_its_threads_and_close_ends_them() -> None:
    sink = PrometheusEventHandler.serve(port_base=0, registry=prometheus_client.CollectorRegistry())
    port = sink.port
    assert port is not None
    idle = []
    try:
        for _ in range(150):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        # 64 connection threads at most (and 8 answering 503 when all are busy).
        assert 0 < len(scrape_threads()) <= 72
        assert scrape(port) == "200"
    finally:
        sink.close()
    deadline = time.monotonic() + 5.0
    while scrape_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scrape_threads() == []
    for connection in idle:  # every one closed by the server
        connection.settimeout(5)
        try:
            assert connection.recv(1) == b""
        except ConnectionResetError:
            pass
        connection.close()


FORKED = """
import os, socket, sys, time
from datetime import datetime
import prometheus_client
import torchmon

options = {} if sys.argv[1] == "rust" else {"registry": prometheus_client.CollectorRegistry()}
sink = torchmon.PrometheusEventHandler.serve(port_base=0, **options)
sink(torchmon.Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 1.0}))
port = sink.port
silent = socket.create_connection(("127.0.0.1", port))  # open at the fork
time.sleep(0.3)  # accepted, its thread waiting for a head


def server_sockets() -> int:
    \"\"\"This process's sockets whose local port is the server's.\"\"\"
    found = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            probe = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # not a socket, or gone
        with probe:
            try:
                address = probe.getsockname()
            except OSError:
                continue
            if isinstance(address, tuple) and address[1] == port:
                found += 1
    return found


before = server_sockets()  # the listener and the silent connection
pid = os.fork()
if pid == 0:
    code = 0 if sink.port is None and "serving" not in repr(sink) else 1
    code |= 0 if server_sockets() == 0 else 2
    sink.close()  # nothing to stop here, and nothing to wait for
    os._exit(code)
_, status = os.waitpid(pid, 0)
silent.close()
sink.close()
print(before, os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("server", ["rust", "python"])
def test_a_forked_child_has_no_port_and_holds_none_of_the_servers_sockets(server: str) -> None:
    """The child's handler serves nothing (``port`` is ``None``), and it has
    closed its copies of the listener and of the connection open at the
    fork: a copy would keep that connection open after the parent closes
    it, and the port bound after the parent ends."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORKED), server],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "0"], result.stdout
