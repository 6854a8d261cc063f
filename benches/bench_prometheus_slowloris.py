"""Legitimate scrapes served while slow clients hold connections open.

Run (after ``maturin develop --release``):

    .venv/bin/python benches/bench_prometheus_slowloris.py [--clients 40] [--mode trickle]
        [--seconds 20] [--server rust]

An attacker *process* keeps ``--clients`` connections open to a
``PrometheusEventHandler.serve()`` server: ``trickle`` connections send one
byte of an endless request head every 5 s, ``silent`` ones send nothing;
each one the server closes is reopened at once (a slowloris that gives up
when dropped would be weaker). Meanwhile this process scrapes ``/metrics``
every 100 ms for ``--seconds`` (2 s timeout each, after a 1 s warm-up with
every attacker connected) and counts the answers: ``200``, ``503``, reset,
timeout. ``--server rust`` is ``serve()``'s own registry (the Rust server),
``--server python`` is ``serve(registry=...)`` (the WSGI server of
``wsgi_app()``).

``--idle N`` instead opens N idle connections and prints how many threads
the process has while they are open and 2 s after ``close()``, and how many
of them the server closed. docs/performance.md ("Slow clients") has the
figures.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from typing import Any

HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100_000


def attack(port: int, clients: int, mode: str) -> None:
    """The attacker process: keeps ``clients`` connections open until killed."""
    selector = selectors.DefaultSelector()
    sent: dict[socket.socket, int] = {}

    def connect() -> None:
        while True:
            try:
                connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                time.sleep(0.01)
                continue
            connection.setblocking(False)
            sent[connection] = 0
            selector.register(connection, selectors.EVENT_READ)
            return

    for _ in range(clients):
        connect()
    print("connected", flush=True)
    next_byte = time.monotonic() + 5.0
    while True:
        for key, _ in selector.select(timeout=max(0.0, next_byte - time.monotonic())):
            connection = key.fileobj
            assert isinstance(connection, socket.socket)
            try:
                data = connection.recv(65536)
            except OSError:
                data = b""
            if not data:  # closed (or answered): open another
                selector.unregister(connection)
                del sent[connection]
                connection.close()
                connect()
        if mode == "trickle" and time.monotonic() >= next_byte:
            next_byte += 5.0
            for connection, count in list(sent.items()):
                try:
                    connection.send(HEAD[count : count + 1])
                    sent[connection] = count + 1
                except OSError:
                    pass  # the select above sees it closed


def scrape(port: int, timeout: float) -> str:
    """One scrape: the status code, ``"reset"``, ``"timeout"`` or ``"refused"``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
            connection.settimeout(timeout)
            connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n")
            response = b""
            while True:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                response += chunk
    except ConnectionRefusedError:
        return "refused"
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    except socket.timeout:  # TimeoutError from 3.10 on, not on 3.9
        return "timeout"
    if not response:
        return "closed"
    return response.split(b" ", 2)[1].decode()


def idle_threads(sink: Any, port: int, count: int) -> None:
    """``count`` idle connections: the process's threads (Python's and the
    Rust server's, from /proc/self/task) while open and after close()."""
    server = "rust" if isinstance(sink._server, int) else "python"

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    start = time.monotonic()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    opened = time.monotonic() - start
    time.sleep(1.0)
    serving = threads()
    sink.close()
    time.sleep(2.0)
    after = threads()
    closed = 0
    for connection in idle:
        connection.settimeout(0.5)
        try:
            closed += connection.recv(1) == b""
        except OSError:
            pass
        connection.close()
    print(
        f"server {server}, {count} idle "
        f"connections (opened in {opened:.1f} s): {serving} threads while open, {after} 2 s "
        f"after close(); the server closed {closed} of them"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--mode", choices=("trickle", "silent"), default="trickle")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--server", choices=("rust", "python"), default="rust")
    parser.add_argument("--idle", type=int, help="open this many idle connections instead")
    parser.add_argument("--attack", type=int, help=argparse.SUPPRESS)  # the attacker process
    args = parser.parse_args()
    if args.attack is not None:
        attack(args.attack, args.clients, args.mode)
        return

    from prometheus_client import CollectorRegistry

    import torchmon

    options = {} if args.server == "rust" else {"registry": CollectorRegistry()}
    sink = torchmon.PrometheusEventHandler.serve(port_base=0, **options)
    sink(torchmon.Event(torchmon.STAT_EVENT, datetime.now(), {"loss.mean": 0.25}))
    port = sink.port
    assert port is not None
    if args.idle is not None:
        idle_threads(sink, port, args.idle)
        return
    command = [sys.executable, __file__, "--attack", str(port), "--clients", str(args.clients)]
    attacker = subprocess.Popen(
        [*command, "--mode", args.mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert attacker.stdout is not None
        assert attacker.stdout.readline().strip() == "connected"
        time.sleep(1.0)
        outcomes: Counter[str] = Counter()
        latencies = []
        start = time.monotonic()
        tick = start
        while tick - start < args.seconds:
            began = time.monotonic()
            outcome = scrape(port, 2.0)
            outcomes[outcome] += 1
            if outcome == "200":
                latencies.append(time.monotonic() - began)
            tick += 0.1
            time.sleep(max(0.0, tick - time.monotonic()))
    finally:
        attacker.kill()
        attacker.wait()
        sink.close()
    total = sum(outcomes.values())
    served = outcomes["200"]
    print(
        f"server {args.server}, {args.clients} {args.mode} slow clients: "
        f"{served} of {total} scrapes served 200 ({100.0 * served / total:.1f} %); "
        + ", ".join(f"{name}: {count}" for name, count in sorted(outcomes.items()))
    )
    if latencies:
        latencies.sort()
        print(
            f"  latency of the served ones: median {1000 * statistics.median(latencies):.1f} ms, "
            f"max {1000 * latencies[-1]:.1f} ms"
        )


if __name__ == "__main__":
    main()
