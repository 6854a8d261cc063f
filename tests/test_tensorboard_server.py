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
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import torchmon
from torchmon import Aggregation, Stat, TensorboardEventHandler
from torchmon.cli import main
from torchmon.testing import ManualClock

tensorboardX = pytest.importorskip("tensorboardX", reason="needs tensorboardX (the writer)")
pytest.importorskip("tensorboard", reason="needs tensorboard (the server)")

DEADLINE = 90.0  # seconds for the server to start and load the runs
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


def tensorboard_command() -> list[str]:
    script = Path(sys.executable).parent / "tensorboard"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "tensorboard.main"]


def data_server_installed() -> bool:
    try:
        from tensorboard_data_server import server_binary  # type: ignore[import-not-found]
    except ImportError:
        return False
    return server_binary() is not None


class Server:
    def __init__(self, logdir: Path, output: Path) -> None:
        self.output = output
        self._out = output.open("wb")
        # Default loader settings: no --load_fast, --reload_interval, --samples_per_plugin.
        self.proc = subprocess.Popen(
            [*tensorboard_command(), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self.url = self._wait_for_url()

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def _wait_for_url(self) -> str:
        # --port 0: TensorBoard binds a free port and prints it.
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            found = re.search(r"at (http://127\.0\.0\.1:\d+/)", self.log())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                pytest.fail(f"tensorboard exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        pytest.fail(f"tensorboard did not start within {DEADLINE} s:\n{self.log()}")

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._out.close()


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
    srv = Server(logdir, root / "tensorboard.log")
    try:
        yield srv
    finally:
        srv.stop()


def scalars(srv: Server, run: str) -> dict[str, list[tuple[float, int, float]]]:
    """[(wall_time, step, value)] of every scalar tag of ``run``, from the server."""
    tags = srv.get("data/plugin/scalars/tags").get(run, {})
    return {
        tag: [tuple(point) for point in srv.get("data/plugin/scalars/scalars", run=run, tag=tag)]
        for tag in tags
    }


def wait_for_runs(
    srv: Server, runs: set[str]
) -> dict[str, dict[str, list[tuple[float, int, float]]]]:
    """The scalars of ``runs`` once the server shows every expected tag with
    every window (it loads in the background), or as they are at the deadline."""
    expected = expected_points()
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            got = (
                {run: scalars(srv, run) for run in runs}
                if runs <= set(srv.get("data/runs"))
                else {}
            )
        except OSError:  # not answering yet
            got = {}
        complete = bool(got) and all(
            all(len(data.get(tag, [])) >= len(points) for tag, points in expected.items())
            for data in got.values()
        )
        if complete or time.monotonic() > deadline:
            return got
        if srv.proc.poll() is not None:
            pytest.fail(f"tensorboard exited with {srv.proc.returncode}:\n{srv.log()}")
        time.sleep(0.25)


def test_every_stat_window_is_a_point_with_its_step_and_value(server: Server) -> None:
    got = wait_for_runs(server, {"live", "converted"})
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
    got = wait_for_runs(server, {"live", "converted"})
    assert got["converted"] == got["live"]
