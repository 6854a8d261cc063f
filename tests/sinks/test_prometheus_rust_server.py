"""The server of PrometheusEventHandler.serve() with its own registry: a
Rust thread that never attaches to Python (docs/sinks.md, "Native
histograms"; docs/reliability.md). Scrapes answered while the main thread
holds the GIL, paths and methods, a stalled client beside a scrape, a
forked child that closes its copy of the handler, and the interpreter exit
with the server running. The ones that could hang run in a child process
with a timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from datetime import datetime

import pytest

from torchmon import STAT_EVENT, Event, PrometheusEventHandler

pytest.importorskip("prometheus_client")


SCRAPER = """
import sys, urllib.request
for accept in ("text/plain", "application/vnd.google.protobuf;"
               "proto=io.prometheus.client.MetricFamily;encoding=delimited"):
    request = urllib.request.Request(sys.argv[1], headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=6) as response:
            body = response.read()
            print(response.status, b"loss_mean" in body, flush=True)
    except OSError as exc:
        print("failed", type(exc).__name__, flush=True)
"""


def run_child(code: str, timeout: float = 60, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_scrapes_are_answered_while_the_main_thread_holds_the_gil() -> None:
    """The main thread spins in Python with a 100 s switch interval, so no
    other thread of the process gets the GIL; a scraper process still gets
    the text and the protobuf body."""
    out = run_child(
        """
        import subprocess, sys, time
        from datetime import datetime
        import torchmon
        sink = torchmon.PrometheusEventHandler.serve(port_base=0)
        sink(torchmon.Event(torchmon.STAT_EVENT, datetime.now(), {"loss.mean": 0.25}))
        url = f"http://127.0.0.1:{sink.port}/metrics"
        command = [sys.executable, "-c", sys.argv[1], url]
        scraper = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        sys.setswitchinterval(100.0)
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:  # no call here releases the GIL
            pass
        sys.setswitchinterval(0.005)
        print(scraper.communicate(timeout=30)[0].strip().replace("\\n", ";"))
        sink.close()
        """,
        60,
        SCRAPER,
    )
    assert out == "200 True;200 True"


def scrape(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        # Closed here: CPython 3.14 warns (ResourceWarning) about an HTTPError
        # whose response is left to the garbage collector.
        exc.close()
        return int(exc.code)


def test_paths_other_than_metrics_are_404_and_a_stalled_client_blocks_no_scrape() -> None:
    sink = PrometheusEventHandler.serve(port_base=0)
    try:
        sink(Event(STAT_EVENT, datetime.now(), {"a.sum": 1.0}))
        base = f"http://127.0.0.1:{sink.port}"
        stalled = [socket.create_connection(("127.0.0.1", sink.port)) for _ in range(4)]
        for connection in stalled:
            connection.sendall(b"GET /metr")  # and never the rest
        start = time.monotonic()
        assert scrape(base + "/metrics") == 200
        assert scrape(base + "/") == 200
        assert scrape(base + "/metrics?x=1") == 200
        assert scrape(base + "/favicon.ico") == 404
        # Well below the server's 5 s head deadline: nothing waited for them.
        assert time.monotonic() - start < 4.0
        for connection in stalled:
            connection.close()
    finally:
        sink.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_closing_its_handler_leaves_the_parents_server_serving() -> None:
    out = run_child(
        """
        import os, urllib.request
        from datetime import datetime
        import torchmon
        sink = torchmon.PrometheusEventHandler.serve(port_base=0)
        sink(torchmon.Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 1.0}))
        url = f"http://127.0.0.1:{sink.port}/metrics"
        pid = os.fork()
        if pid == 0:
            # The server thread is the parent's: closing must not wait for it.
            sink.close()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        with urllib.request.urlopen(url, timeout=10) as response:
            print(os.waitstatus_to_exitcode(status), response.status, b"a_sum" in response.read())
        sink.close()
        """,
        timeout=40,
    )
    assert out == "0 200 True"


def test_the_interpreter_exits_with_a_server_running_and_frees_the_port() -> None:
    out = run_child(
        """
        from datetime import datetime
        import torchmon
        sink = torchmon.PrometheusEventHandler.serve(port_base=0)
        sink(torchmon.Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 1.0}))
        print(sink.port)
        """,
        timeout=30,
    )
    port = int(out)
    with socket.socket() as probe:  # the port was freed: no listener left
        probe.bind(("127.0.0.1", port))
