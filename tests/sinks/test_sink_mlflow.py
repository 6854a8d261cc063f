"""MLflowEventHandler against real MLflow on a sqlite store: the metric
histories read back with ``MlflowClient.get_metric_history`` equal the
windows of the JSON lines log of the same run; steps, timestamps, NaN and the
infinities, renamed keys, other events as tags, the run the handler creates
and ends, an unreachable tracking URI at construction, bad arguments, and
the import rules (docs/sinks.md, "MLflow")."""

from __future__ import annotations

import hashlib
import math
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import emit_open_windows, registered

import torchmon
from torchmon import Aggregation, Event, Stat
from torchmon.handlers.mlflow import mlflow_key
from torchmon.testing import ManualClock

mlflow = pytest.importorskip("mlflow", reason="MLflow (the mlflow extra) is not installed")
from mlflow.tracking import MlflowClient  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module (creating one costs seconds)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return f"sqlite:///{path}"


def digest(key: str) -> str:
    """The 8 hex digits a renamed key carries (docs/sinks.md, "MLflow")."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def histories(uri: str, run_id: str) -> dict[str, list[tuple[float, int, int]]]:
    client = MlflowClient(uri)
    keys = client.get_run(run_id).data.metrics
    return {
        key: sorted(
            ((m.value, m.step, m.timestamp) for m in client.get_metric_history(run_id, key)),
            key=lambda row: row[1],
        )
        for key in keys
    }


def jsonl_windows(path: Path) -> dict[str, list[tuple[float, int, int]]]:
    """The Stat windows of a JSON lines log as MLflow rows: step = the
    window's number per Stat, timestamp in ms."""
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


def test_histories_equal_the_jsonl_log(store: str, tmp_path: Path) -> None:
    sink = torchmon.MLflowEventHandler(store, experiment_name="equal")
    log = torchmon.JsonlEventHandler(tmp_path / "events.jsonl")
    assert sink.run_id is not None
    with registered(sink), registered(log):
        loss = Stat(
            "train.loss", [Aggregation.MEAN, Aggregation.P50, Aggregation.P99], timedelta(hours=1)
        )
        lr = Stat("train.lr", [Aggregation.VALUE], timedelta(hours=1))
        for window in range(6):
            for i in range(10):
                loss.add(float(window * 10 + i))
            if window % 2 == 0:
                lr.add(0.1 / (window + 1))
            emit_open_windows(loss, lr)
        assert sink.flush(30.0)
    log.close()
    sink.close()
    got = histories(store, sink.run_id)
    want = jsonl_windows(tmp_path / "events.jsonl")
    assert set(got) == {"train.loss.mean", "train.loss.p50", "train.loss.p99", "train.lr.value"}
    assert got == want
    run = MlflowClient(store).get_run(sink.run_id)
    assert run.info.status == "FINISHED"  # the handler created it and ended it
    assert run.info.run_name == "rank0"
    assert run.data.tags["rank"] == "0" and run.data.tags["node"] == "0"


def test_active_run_is_used(store: str) -> None:
    mlflow.set_tracking_uri(store)
    try:
        with mlflow.start_run() as run:
            sink = torchmon.MLflowEventHandler()
            assert sink.run_id == run.info.run_id
            with registered(sink):
                stat = Stat("a", [Aggregation.MEAN], timedelta(hours=1))
                stat.add(2.0)
                emit_open_windows(stat)
            sink.close()
            # Not ended by the handler: it is the user's.
            assert MlflowClient(store).get_run(run.info.run_id).info.status == "RUNNING"
        assert histories(store, run.info.run_id)["a.mean"][0][:2] == (2.0, 1)
    finally:
        mlflow.set_tracking_uri(None)


def test_step_callable_nan_inf_and_renamed_key(
    store: str, capfd: pytest.CaptureFixture[str]
) -> None:
    step = [0]
    sink = torchmon.MLflowEventHandler(store, experiment_name="values", step=lambda: step[0])
    with registered(sink):
        stat = Stat("odd key!", [Aggregation.MEAN], timedelta(hours=1))
        for value in (math.nan, math.inf, -math.inf, 1.5):
            step[0] += 100
            stat.add(value)
            emit_open_windows(stat)
    sink.close()
    got = histories(store, sink.run_id)  # type: ignore[arg-type]
    values = [(v, s) for v, s, _ in got[f"odd key_-{digest('odd key!.mean')}.mean"]]
    # NaN is kept; the sqlite store keeps an infinity as +-DBL_MAX.
    assert math.isnan(values[0][0]) and values[0][1] == 100
    assert values[1:] == [(sys.float_info.max, 200), (-sys.float_info.max, 300), (1.5, 400)]
    err = capfd.readouterr().err
    assert err.count(f"key 'odd key!.mean' sent as 'odd key_-{digest('odd key!.mean')}.mean'") == 1


def test_keys_renamed_alike_stay_distinct(store: str, capfd: pytest.CaptureFixture[str]) -> None:
    sink = torchmon.MLflowEventHandler(store, experiment_name="alike")
    with registered(sink):
        comma = Stat("loss,a", [Aggregation.MEAN], timedelta(hours=1))
        semicolon = Stat("loss;a", [Aggregation.MEAN], timedelta(hours=1))
        for i in range(3):
            comma.add(float(i))
            semicolon.add(100.0 + i)
            emit_open_windows(comma, semicolon)
        assert sink.flush(10.0)
    sink.close()
    got = histories(store, sink.run_id)  # type: ignore[arg-type]
    assert {k: [v for v, _, _ in rows] for k, rows in got.items()} == {
        f"loss_a-{digest('loss,a.mean')}.mean": [0.0, 1.0, 2.0],
        f"loss_a-{digest('loss;a.mean')}.mean": [100.0, 101.0, 102.0],
    }
    assert capfd.readouterr().err.count("sent as") == 1


def test_other_events_become_tags(store: str) -> None:
    sink = torchmon.MLflowEventHandler(store, experiment_name="tags", tags={"team": "a"})
    with registered(sink):
        for epoch in (1, 2):
            torchmon.log_event(Event("epoch_end", datetime.now(), {"epoch": epoch, "ok": True}))
        assert sink.flush(30.0)
    sink.close()
    tags = MlflowClient(store).get_run(sink.run_id).data.tags  # type: ignore[arg-type]
    assert tags["epoch_end.epoch"] == "2" and tags["epoch_end.ok"] == "True"
    assert tags["team"] == "a"


def test_batches_of_at_most_1000(store: str) -> None:
    sink = torchmon.MLflowEventHandler(store, experiment_name="big")
    sent: list[int] = []
    real = sink._client.log_batch

    def spy(run_id: str, metrics: Any = (), **kwargs: Any) -> None:
        sent.append(len(metrics))
        real(run_id, metrics=metrics, **kwargs)

    sink._client.log_batch = spy  # type: ignore[method-assign]
    with registered(sink):
        stats = [Stat(f"s{i}", [Aggregation.MEAN], timedelta(hours=1)) for i in range(1500)]
        for stat in stats:
            stat.add(1.0)
        emit_open_windows(*stats)
    sink.close()
    assert sum(sent) == 1500 and max(sent) <= 1000
    assert len(histories(store, sink.run_id)) == 1500  # type: ignore[arg-type]


def test_unreachable_at_construction(capfd: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    sink = torchmon.MLflowEventHandler(
        f"http://127.0.0.1:{port}", export_timeout=0.5, max_queue=3, retry_interval=0.1
    )
    assert time.monotonic() - start < 3.0
    assert sink.run_id is None
    with registered(sink):
        with ManualClock(0) as clock:  # 5 windows closed by the adds, no flush
            stat = Stat("a", [Aggregation.MEAN], timedelta(seconds=1))
            for i in range(6):
                stat.add(float(i))
                clock.advance(1000)
        start = time.monotonic()
        assert not sink.flush()
        assert time.monotonic() - start < 2.0
    sink.close()
    assert sink.dropped == 2
    err = capfd.readouterr().err
    # The run's creation failed on the sender: the outage's line, then the
    # loss at close.
    assert err.count("were not delivered to MLflow") == 1
    assert err.count("3 windows still queued were not delivered and are lost; 2 were dropped") == 1


def test_mlflow_key() -> None:
    assert mlflow_key("train.loss.mean") == "train.loss.mean"
    assert mlflow_key("a/b c:d-e_f.p99") == "a/b c:d-e_f.p99"
    assert mlflow_key("a!b.mean") == f"a_b-{digest('a!b.mean')}.mean"
    assert mlflow_key("/abs") == f"_abs-{digest('/abs')}"
    assert mlflow_key("a//b") == f"a__b-{digest('a//b')}"
    assert mlflow_key("..x") == f"_.-{digest('..x')}.x"
    assert mlflow_key("") == f"_-{digest('')}"
    long = mlflow_key("x" * 300 + ".mean")
    assert len(long) == 250 and long.endswith(".mean")
    assert mlflow_key("x" * 300 + ".max") != mlflow_key("x" * 301 + ".max")


def test_bad_arguments(store: str) -> None:
    with pytest.raises(TypeError, match=r"^MLflowEventHandler\(run_id\): run_id must be a str"):
        torchmon.MLflowEventHandler(store, run_id=3)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"^MLflowEventHandler\(batch_size\): batch_size must be in 1\.\.1000, got"
    ):
        torchmon.MLflowEventHandler(store, batch_size=1001)
    with pytest.raises(ValueError, match=r"^MLflowEventHandler\(tags\): tags has a key"):
        torchmon.MLflowEventHandler(store, tags={"a!": "b"})


def test_import_rules() -> None:
    code = (
        "import sys, torchmon\n"
        "assert 'mlflow' not in sys.modules and 'wandb' not in sys.modules\n"
        "torchmon.MLflowEventHandler\n"
        "assert 'mlflow' not in sys.modules\n"
        "sys.modules['mlflow'] = None\n"
        "try:\n"
        "    torchmon.MLflowEventHandler()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "MLflowEventHandler needs MLflow" in out.stdout
    assert "pip install '.[mlflow]'" in out.stdout
