"""An OpenTelemetry collector that is down or never answers costs a bounded
time: ``torchmon.flush()`` and the process exit each wait at most the
handler's ``export_timeout`` for it, the other sinks are flushed first and
keep every window, and what was not sent is one line on stderr, not a log
line per retry (docs/sinks.md, "Unreachable collector").

Each case runs in a child process with a timeout, against a port on
127.0.0.1 that refuses connections or a socket that accepts them and never
answers.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")
pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    reason="the OTLP/HTTP exporter (the otlp extra) is not installed",
)

EXPORT_TIMEOUT = 1.0

# The OTLP handler is made first, so that its exit hook would run last of
# the two if nothing ordered them; JSONL must be complete either way.
CHILD = """
import json, sys, time
from datetime import timedelta
import torchmon

endpoint, events, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
otlp = torchmon.OpenTelemetryEventHandler.otlp(endpoint, export_timeout=timeout)
torchmon.register_event_handler(otlp)
torchmon.register_event_handler(torchmon.JsonlEventHandler(events))
stat = torchmon.Stat("loss", [torchmon.Aggregation.MEAN], timedelta(hours=1))
stat.add(1.0)
start = time.monotonic()
torchmon.flush()
print(json.dumps({"flush_seconds": time.monotonic() - start}), flush=True)
stat.add(2.0)  # emitted by the exit flush
"""


@contextmanager
def refused_port() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1/metrics"


@contextmanager
def silent_listener() -> Iterator[str]:
    """A socket whose backlog accepts connections that nobody ever reads."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1/metrics"


@pytest.mark.parametrize("collector", [refused_port, silent_listener], ids=["refused", "silent"])
def test_dead_collector_bounds_flush_and_exit(collector: object, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    with collector() as endpoint:  # type: ignore[operator]
        start = time.monotonic()
        child = subprocess.run(
            [sys.executable, "-c", CHILD, endpoint, str(events), str(EXPORT_TIMEOUT)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        total = time.monotonic() - start
    assert child.returncode == 0, child.stderr
    flush_seconds = json.loads(child.stdout)["flush_seconds"]
    # One export_timeout for the flush, one for the exit's last export, and
    # the interpreter's start and end (about a second here; the margins are
    # for a loaded machine: before export_timeout, the exporter's own 10 s
    # made these 7-10 s and 25-32 s, docs/performance.md).
    assert flush_seconds < EXPORT_TIMEOUT + 2.0, child.stderr
    assert total < 2 * EXPORT_TIMEOUT + 10.0, child.stderr
    lines = child.stderr.splitlines()
    assert not [line for line in lines if "retry" in line.lower() or "Transient" in line], lines
    reports = [line for line in lines if line.startswith("torchmon: OpenTelemetryEventHandler")]
    assert len(reports) == 1, lines
    assert endpoint in reports[0] and "not sent" in reports[0]
    assert len(lines) == 1, lines
    written = [json.loads(line)["data"] for line in events.read_text().splitlines()]
    assert written == [{"loss.mean": 1.0}, {"loss.mean": 2.0}]


# Nothing is recorded after the flush: neither a second flush nor the exit
# has anything new to send, and neither waits for the silent collector again.
CHILD_NOTHING_NEW = """
import json, sys, time
from datetime import timedelta
import torchmon

endpoint, timeout = sys.argv[1], float(sys.argv[2])
otlp = torchmon.OpenTelemetryEventHandler.otlp(endpoint, export_timeout=timeout)
torchmon.register_event_handler(otlp)
stat = torchmon.Stat("loss", [torchmon.Aggregation.MEAN], timedelta(hours=1))
stat.add(1.0)
times = []
for _ in range(2):
    start = time.monotonic()
    sent = torchmon.flush()
    times.append(time.monotonic() - start)
print(json.dumps({"flush_seconds": times, "sent": otlp.flush()}), flush=True)
"""


def test_nothing_recorded_since_a_failed_export_is_not_waited_for_again() -> None:
    timeout = 3.0
    with silent_listener() as endpoint:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD_NOTHING_NEW, endpoint, str(timeout)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = child.stdout.readline()  # type: ignore[union-attr]
            printed = time.monotonic()
            _, stderr = child.communicate(timeout=120)
            exit_seconds = time.monotonic() - printed
        finally:
            child.kill()
    assert child.returncode == 0, stderr
    result = json.loads(line)
    first, second = result["flush_seconds"]
    assert timeout - 0.1 <= first < timeout + 2.0, stderr
    # The second flush and the exit: the interpreter's end only.
    assert second < 0.5, stderr
    assert result["sent"] is False  # the data are still not sent
    assert exit_seconds < timeout / 2, stderr
    reports = [line for line in stderr.splitlines() if line.startswith("torchmon:")]
    assert len(reports) == 1 and "not sent" in reports[0], stderr


def test_a_last_export_that_does_not_finish_by_the_exit_is_reported() -> None:
    """The exit's own export (no flush before it) against a silent collector:
    one line on stderr says what was not sent."""
    code = (
        "import sys, torchmon\n"
        "otlp = torchmon.OpenTelemetryEventHandler.otlp(sys.argv[1], export_timeout=1.0)\n"
        "torchmon.register_event_handler(otlp)\n"
        "stat = torchmon.Stat('loss', [torchmon.Aggregation.MEAN], 3600.0)\n"
        "stat.add(1.0)\n"
    )
    with silent_listener() as endpoint:
        child = subprocess.run(
            [sys.executable, "-c", code, endpoint], capture_output=True, text=True, timeout=120
        )
    assert child.returncode == 0, child.stderr
    lines = child.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("torchmon: OpenTelemetryEventHandler: the metrics since ")
    # Usually "did not finish within export_timeout=1 s"; the exporter's own
    # 1 s request timeout may win the race and name the timeout instead.
    assert f"were not sent to {endpoint}: " in lines[0]
