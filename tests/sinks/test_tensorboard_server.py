"""What a real TensorBoard server shows of torchmon's files (docs/sinks.md,
"TensorBoard"; docs/compatibility.md, the step of Stat scalars).

A short run is recorded live (TensorboardEventHandler on a tensorboardX
writer) and into JSON lines that ``torchmon to-tensorboard`` converts; a
``tensorboard`` process from this venv, with its default loader settings,
serves both as two runs, and its HTTP API must return every window of every
Stat tag, with the right step and value, and the same points for both runs.

TensorBoard's default loader (``--load_fast``: the Rust data server of the
tensorboard-data-server package, used whenever that is installed) keeps one
point per step of a tag, which is why torch.monitor's step-less scalars show
up as a single dot each.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from tensorboard_server import Server, data_server_installed, tensorboard_command

import torchmon
from torchmon import Aggregation, Stat, TensorboardEventHandler
from torchmon.cli import main
from torchmon.testing import ManualClock

tensorboardX = pytest.importorskip("tensorboardX", reason="needs tensorboardX (the writer)")
pytest.importorskip("tensorboard", reason="needs tensorboard (the server)")

WINDOWS = 4
# Per window: the samples of "train.loss" and of "lr" (float32-exact values,
# since TensorBoard stores scalars as float32).
LOSS = [[2.0, 1.0, 3.0], [1.5, 0.5], [0.75], [0.25, 0.5, 0.125, 0.0]]
LR = [[0.5], [0.25, 0.25], [0.125], [0.0625]]


def expected_points() -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every Stat tag: one point per window, steps 1..WINDOWS."""
    expected: dict[str, list[tuple[int, float]]] = {}
    for i, (loss, lr) in enumerate(zip(LOSS, LR), start=1):
        for tag, value in (
            ("train.loss.mean", sum(loss) / len(loss)),
            ("train.loss.max", max(loss)),
            ("train.loss.count", float(len(loss))),
            ("lr.value", lr[-1]),
        ):
            expected.setdefault(tag, []).append((i, value))
    return expected


def record(logdir: Path, jsonl: Path) -> None:
    """WINDOWS windows of two Stats (1 s windows rolled by a ManualClock) and
    one epoch event, into TensorBoard files in ``logdir`` and JSON lines."""
    agg = Aggregation
    with tensorboardX.SummaryWriter(logdir=str(logdir)) as writer:
        tb = TensorboardEventHandler(writer, other_events=True, step_field="epoch")
        lines = torchmon.JsonlEventHandler(str(jsonl))
        handles = [torchmon.register_event_handler(h) for h in (tb, lines)]
        try:
            with ManualClock(0) as clock:
                loss = Stat("train.loss", [agg.MEAN, agg.MAX, agg.COUNT], timedelta(seconds=1))
                lr = Stat("lr", [agg.VALUE], timedelta(seconds=1))
                for i, (loss_window, lr_window) in enumerate(zip(LOSS, LR)):
                    if i:
                        clock.advance(1000)  # the next add closes the window
                    loss.add_many(loss_window)
                    for value in lr_window:
                        lr.add(value)
                torchmon.log_event(
                    torchmon.Event("train.epoch_end", datetime.now(), {"epoch": 1, "loss": 0.5})
                )
                del loss, lr  # the last windows
                gc.collect()
        finally:
            for handle in handles:
                torchmon.unregister_event_handler(handle)
            lines.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("tb-server")
    logdir = root / "logs"
    jsonl = root / "events.jsonl"
    record(logdir / "live", jsonl)
    assert (
        main(["to-tensorboard", str(jsonl), str(logdir / "converted"), "--step-field", "epoch"])
        == 0
    )
    # Default loader settings: no --load_fast, --reload_interval, --samples_per_plugin.
    srv = Server([*tensorboard_command(), "--logdir", str(logdir)], root / "tensorboard.log")
    try:
        yield srv
    finally:
        srv.stop()


def wait_for_runs(srv: Server) -> dict[str, dict[str, list[tuple[float, int, float]]]]:
    return srv.wait_for(
        {"live", "converted"}, {tag: len(p) for tag, p in expected_points().items()}
    )


def test_every_stat_window_is_a_point_with_its_step_and_value(server: Server) -> None:
    got = wait_for_runs(server)
    assert sorted(server.get("data/runs")) == ["converted", "live"]
    if data_server_installed():
        # The default loader here is the Rust data server, the one that keeps a
        # single point per step.
        assert "Using experimental fast data loading logic" in server.log(), server.log()
    for run in ("live", "converted"):
        data = got.get(run, {})
        for tag, points in expected_points().items():
            assert [(step, value) for _, step, value in data.get(tag, [])] == points, (run, tag)
        # The epoch event, at the step of its "epoch" field.
        assert [(s, v) for _, s, v in data["train.epoch_end/loss"]] == [(1, 0.5)]
        assert sorted(data) == sorted([*expected_points(), "train.epoch_end/loss"])
        # Wall times: the events' timestamps, one window after another.
        walls = [wall for wall, _, _ in data["train.loss.mean"]]
        assert walls == sorted(walls)
        assert abs(walls[-1] - time.time()) < 3600


def test_a_converted_log_is_served_like_the_live_one(server: Server) -> None:
    got = wait_for_runs(server)
    assert got["converted"] == got["live"]
