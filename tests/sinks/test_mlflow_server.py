"""MLflowEventHandler against a real ``mlflow server`` on 127.0.0.1, killed
mid-run and started again: training goes on at the same speed, the JSON
lines log is complete, the outage is one stderr line (and one at recovery),
and every window reaches MLflow once the server is back, so the metric
histories equal the JSON lines log (docs/sinks.md, "MLflow")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="MLflow (the mlflow extra) is not installed")
from mlflow.tracking import MlflowClient

import torchmon

pytestmark = pytest.mark.slow

MLFLOW = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or shutil.which("mlflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mlflow_server(tmp: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """``mlflow server`` on 127.0.0.1:port with a sqlite store in ``tmp``,
    in its own process group; yields once /health answers."""
    assert MLFLOW is not None
    log = (tmp / "server.log").open("ab")
    server = subprocess.Popen(
        [
            MLFLOW,
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp / 'server.db'}",
            "--default-artifact-root",
            str(tmp / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("mlflow server did not start:\n" + (tmp / "server.log").read_text())
                time.sleep(0.25)
        yield server
    finally:
        kill_group(server)
        log.close()


def kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


# The training job: one step is a fixed amount of work; a window every
# 100 ms of two Stats; its step times to a file. It runs until told to stop
# (a file), so that the server can be killed and restarted meanwhile.
CHILD = """
import json, sys, time
from datetime import timedelta
from pathlib import Path
import torchmon

uri, tmp = sys.argv[1], Path(sys.argv[2])
sink = torchmon.MLflowEventHandler(uri, experiment_name="kill", export_timeout=15.0,
                                   retry_interval=0.2)
print(json.dumps({"run_id": sink.run_id}), flush=True)
torchmon.register_event_handler(torchmon.JsonlEventHandler(tmp / "events.jsonl"))
torchmon.register_event_handler(sink)
step_time = torchmon.Stat("train.step_time", [torchmon.Aggregation.MEAN,
                          torchmon.Aggregation.P50, torchmon.Aggregation.P99],
                          timedelta(milliseconds=100))
loss = torchmon.Stat("train.loss", [torchmon.Aggregation.MEAN], timedelta(milliseconds=100))
times = []
step = 0
while not (tmp / "stop").exists():
    start = time.perf_counter()
    total = 0
    for i in range(20000):
        total += i * i
    elapsed = time.perf_counter() - start
    step_time.add(elapsed)
    loss.add(1.0 / (step + 1))
    times.append((time.time(), elapsed))
    step += 1
(tmp / "times.json").write_text(json.dumps(times))
"""


def windows_of(path: Path) -> dict[str, list[tuple[float, int, int]]]:
    counts: dict[str, int] = {}
    out: dict[str, list[tuple[float, int, int]]] = {}
    for event in torchmon.read_jsonl(path):
        if event.name != torchmon.STAT_EVENT:
            continue
        stat = next(iter(event.data)).rpartition(".")[0]
        counts[stat] = counts.get(stat, 0) + 1
        ms = int(event.timestamp.timestamp() * 1000)
        for key, value in event.data.items():
            out.setdefault(key, []).append((float(value), counts[stat], ms))  # type: ignore[arg-type]
    return out


@pytest.mark.skipif(MLFLOW is None, reason="the mlflow command is not installed")
def test_server_killed_mid_run(tmp_path: Path) -> None:
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    child: subprocess.Popen[str] | None = None
    try:
        with mlflow_server(tmp_path, port) as server:
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, uri, str(tmp_path)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert child.stdout is not None
            run_id = json.loads(child.stdout.readline())["run_id"]
            assert run_id
            client = MlflowClient(uri)
            deadline = time.monotonic() + 60
            while not client.get_metric_history(run_id, "train.loss.mean"):
                assert time.monotonic() < deadline, "no window reached the server"
                time.sleep(0.2)
            time.sleep(1.5)  # the "before" part of the step times
            killed_at = time.time()
            kill_group(server)
        time.sleep(3.0)  # the outage
        back_at = time.time()
        with mlflow_server(tmp_path, port):
            time.sleep(3.0)  # the queued windows go out, and new ones
            (tmp_path / "stop").touch()
            _, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            got = {
                key: sorted(
                    (
                        (m.value, m.step, m.timestamp)
                        for m in client.get_metric_history(run_id, key)
                    ),
                    key=lambda row: row[1],
                )
                for key in client.get_run(run_id).data.metrics
            }
            status = client.get_run(run_id).info.status
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
    want = windows_of(tmp_path / "events.jsonl")
    assert set(got) == set(want)
    assert got == want  # every window, delivered once, nothing dropped
    assert status == "FINISHED"
    assert err.count("were not delivered to MLflow at " + uri) == 1, err
    assert err.count("delivering to MLflow at " + uri + " again") == 1, err
    times = json.loads((tmp_path / "times.json").read_text())
    before = [t for at, t in times if at < killed_at]
    during = [t for at, t in times if killed_at + 0.5 < at < back_at]
    assert len(before) > 100 and len(during) > 100
    ratio = statistics.median(during) / statistics.median(before)
    print(
        f"median step time: before {statistics.median(before) * 1e3:.3f} ms, during the "
        f"outage {statistics.median(during) * 1e3:.3f} ms (x{ratio:.2f})"
    )
    assert ratio < 1.5
