"""WandbEventHandler against real W&B in offline mode (nothing leaves the
machine), read back with tests/wandb_offline.py: the history equals the
windows of the JSON lines log of the same run (values, NaN and the
infinities, the ``torchmon/step`` x-axis), two Stats at different window
rates all kept (where ``run.log(step=)`` would drop the slower one), a
user's run, the run the handler starts and finishes, other events in the
summary, bounded flush and close, the sender thread alone calling
``run.log``, bad arguments and the import rules (docs/sinks.md, "W&B")."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import emit_open_windows, registered
from wandb_offline import read_config, read_history, read_summary

import torchmon
from torchmon import Aggregation, Event, Stat
from torchmon.handlers.wandb import STEP_METRIC, wandb_key
from torchmon.testing import ManualClock

wandb = pytest.importorskip("wandb", reason="W&B (the wandb extra) is not installed")

OFFLINE_ENV = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_CONSOLE": "off",
}


@pytest.fixture
def offline_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """wandb offline, quiet, and confined to tmp_path (as in
    test_wandb_offline_reader.py)."""
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    env = {
        **OFFLINE_ENV,
        "WANDB_DIR": str(tmp_path),
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
        "WANDB_ARTIFACT_DIR": str(tmp_path / "artifacts"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def digest(key: str) -> str:
    """The 8 hex digits a renamed key carries (docs/sinks.md, "W&B")."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def run_dir(run: Any) -> Path:
    return Path(run.dir).parent  # .../wandb/offline-run-<time>-<id>


def series(history: list[dict[str, Any]]) -> dict[str, list[tuple[float, int]]]:
    """Per key (wandb's own and the step metric left out): (value, torchmon/step)."""
    out: dict[str, list[tuple[float, int]]] = {}
    for row in history:
        for key, value in row.items():
            if key.startswith("_") or key == STEP_METRIC:
                continue
            out.setdefault(key, []).append((value, row[STEP_METRIC]))
    return out


def jsonl_windows(path: Path) -> dict[str, list[tuple[float, int]]]:
    """The Stat windows of a JSON lines log: (value, window number per Stat)."""
    counts: dict[str, int] = {}
    out: dict[str, list[tuple[float, int]]] = {}
    for event in torchmon.read_jsonl(path):
        if event.name != torchmon.STAT_EVENT:
            continue
        stat = next(iter(event.data)).rpartition(".")[0]
        counts[stat] = counts.get(stat, 0) + 1
        for key, value in event.data.items():
            out.setdefault(key, []).append((value, counts[stat]))  # type: ignore[arg-type]
    return out


def same(got: dict[str, list[tuple[float, int]]], want: dict[str, list[tuple[float, int]]]) -> bool:
    """Equal by value (wandb writes 2.0 as 2), NaN equal to NaN."""
    if got.keys() != want.keys():
        return False
    for key in want:
        if len(got[key]) != len(want[key]):
            return False
        for (gv, gs), (wv, ws) in zip(got[key], want[key]):
            if gs != ws or type(gs) is not int:
                return False
            if not (gv == wv or (math.isnan(gv) and math.isnan(wv))):
                return False
    return True


class LogSpy:
    """Wraps ``run.log``: the calls and the threads they came from."""

    def __init__(self, run: Any) -> None:
        self.real = run.log
        self.calls: list[dict[str, Any]] = []
        self.threads: set[str] = set()
        run.log = self

    def __call__(self, data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append(dict(data))
        assert "step" not in kwargs and not args
        self.real(data, *args, **kwargs)


def test_history_equals_the_jsonl_log(offline_env: Path) -> None:
    run = wandb.init(project="torchmon-test", name="equal")
    spy = LogSpy(run)
    sink = torchmon.WandbEventHandler(run)
    log = torchmon.JsonlEventHandler(offline_env / "events.jsonl")
    with registered(sink), registered(log):
        loss = Stat("train.loss", [Aggregation.MEAN, Aggregation.MAX], timedelta(hours=1))
        special = Stat("train.special", [Aggregation.VALUE], timedelta(hours=1))
        for window in range(6):
            for i in range(10):
                loss.add(float(window * 10 + i) / 4)
            special.add([math.nan, math.inf, -math.inf, 2.0, 0.1, -0.0][window])
            emit_open_windows(loss, special)
        assert sink.flush(30.0)
    log.close()
    sink.close()
    run.finish()
    history = read_history(run_dir(run))
    got = series(history)
    want = jsonl_windows(offline_env / "events.jsonl")
    assert set(got) == {"train.loss.mean", "train.loss.max", "train.special.value"}
    assert same(got, want), (got, want)
    # One row per step and batch: windows delivered together share a run.log.
    steps = [row[STEP_METRIC] for row in history]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5, 6] and steps == sorted(steps)
    assert len(spy.calls) == len(history) <= 12
    assert spy.threads == {"torchmon-WandbEventHandler"}
    assert all(STEP_METRIC in call for call in spy.calls)


def test_two_rates_every_window_kept(offline_env: Path) -> None:
    """A fast Stat runs ahead of a slow one; W&B drops a run.log(step=) lower
    than the run's step, so the handler's x-axis is torchmon/step."""
    run = wandb.init(project="torchmon-test", name="rates")
    sink = torchmon.WandbEventHandler(run)
    log = torchmon.JsonlEventHandler(offline_env / "events.jsonl")
    with registered(sink), registered(log):
        with ManualClock(0) as clock:
            fast = Stat("fast", [Aggregation.MEAN], timedelta(seconds=1))
            slow = Stat("slow", [Aggregation.MEAN], timedelta(seconds=4))
            for i in range(12):
                fast.add(float(i))
                slow.add(float(i) * 10)
                clock.advance(1000)
                if i % 3 == 2:
                    assert sink.flush(30.0)  # fast's windows delivered ahead of slow's
            emit_open_windows(fast, slow)  # the open windows
        assert sink.flush(30.0)
    log.close()
    sink.close()
    run.finish()
    got = series(read_history(run_dir(run)))
    want = jsonl_windows(offline_env / "events.jsonl")
    assert same(got, want), (got, want)
    assert len(got["fast.mean"]) == 12 and len(got["slow.mean"]) == 3


def test_explicit_lower_step_is_dropped_by_wandb(offline_env: Path) -> None:
    """Why the handler does not pass step=: what W&B 0.31 keeps."""
    run = wandb.init(project="torchmon-test", name="steps")
    for step in (1, 2, 3):
        run.log({"fast.mean": float(step)}, step=step)
    run.log({"slow.mean": 1.0}, step=1)
    run.finish()
    assert "slow.mean" not in series_keys(read_history(run_dir(run)))


def series_keys(history: list[dict[str, Any]]) -> set[str]:
    return {key for row in history for key in row}


def test_handler_starts_and_finishes_its_run(offline_env: Path) -> None:
    assert wandb.run is None
    sink = torchmon.WandbEventHandler(project="torchmon-test")
    run = sink.run
    assert run is not None and wandb.run is run
    with registered(sink):
        stat = Stat("a", [Aggregation.MEAN], timedelta(hours=1))
        stat.add(2.5)
        emit_open_windows(stat)
    start = time.monotonic()
    sink.close()
    assert time.monotonic() - start < sink._timeout + 1.0
    assert wandb.run is None  # finished by the handler
    path = run_dir(run)
    assert [(r["a.mean"], r[STEP_METRIC]) for r in read_history(path)] == [(2.5, 1)]
    config = read_config(path)
    assert run.name == "rank0"
    assert config["rank"] == "0" and config["node"] == "0" and "host" in config
    assert set(run.tags) == {"rank0", "node0"}


def test_active_run_used_not_finished(offline_env: Path) -> None:
    run = wandb.init(project="torchmon-test", name="mine")
    try:
        sink = torchmon.WandbEventHandler()
        assert sink.run is run
        with registered(sink):
            stat = Stat("a", [Aggregation.MEAN], timedelta(hours=1))
            stat.add(1.0)
            emit_open_windows(stat)
        sink.close()
        assert wandb.run is run  # the user's: not finished by the handler
        run.log({"mine": 3})
    finally:
        run.finish()
    rows = read_history(run_dir(run))
    assert [r.get("a.mean") for r in rows] == [1, None]
    assert rows[1]["mine"] == 3


def test_other_events_go_to_the_summary(offline_env: Path) -> None:
    run = wandb.init(project="torchmon-test", name="others")
    sink = torchmon.WandbEventHandler(run)
    with registered(sink):
        for epoch in (1, 2):
            torchmon.log_event(
                Event("epoch_end", datetime.now(), {"epoch": epoch, "ok": True, "note": "x"})
            )
        assert sink.flush(30.0)
    sink.close()
    run.finish()
    summary = read_summary(run_dir(run))
    assert summary["epoch_end.epoch"] == 2 and summary["epoch_end.ok"] is True
    assert summary["epoch_end.note"] == "x"
    assert not any("epoch_end.epoch" in row for row in read_history(run_dir(run)))


def test_renamed_key(offline_env: Path, capfd: pytest.CaptureFixture[str]) -> None:
    run = wandb.init(project="torchmon-test", name="renamed")
    sink = torchmon.WandbEventHandler(run, step=lambda: 7)
    with registered(sink):
        stat = Stat("a*b", [Aggregation.MEAN, Aggregation.MAX], timedelta(hours=1))
        stat.add(1.0)
        emit_open_windows(stat)
    sink.close()
    run.finish()
    rows = read_history(run_dir(run))
    name = f"a_b-{digest('a*b.mean')}.mean"
    assert rows[0][name] == 1 and rows[0][STEP_METRIC] == 7
    err = capfd.readouterr().err
    assert err.count(f"key 'a*b.mean' sent as '{name}'") == 1
    assert "a*b.max" not in err
    assert wandb_key("train.loss.p99") == "train.loss.p99"
    assert wandb_key("a\\b*") == "a_b_-" + digest("a\\b*")
    assert wandb_key("a*b.mean") != wandb_key("a\\b.mean") != "a_b.mean"


def test_flush_and_close_are_bounded(offline_env: Path) -> None:
    run = wandb.init(project="torchmon-test", name="slow")
    gate = threading.Event()
    real = run.log

    def stuck(data: dict[str, Any], **kwargs: Any) -> None:
        gate.wait(30)
        real(data, **kwargs)

    run.log = stuck
    sink = torchmon.WandbEventHandler(run, export_timeout=0.5)
    with registered(sink):
        stat = Stat("a", [Aggregation.MEAN], timedelta(hours=1))
        stat.add(1.0)
        torchmon.flush()
        start = time.monotonic()
        assert not sink.flush(0.3)
        assert time.monotonic() - start < 1.5
    start = time.monotonic()
    sink.close()
    assert time.monotonic() - start < 1.5
    gate.set()
    run.finish()


def test_bad_arguments(offline_env: Path) -> None:
    with pytest.raises(TypeError, match=r"^WandbEventHandler\(run\): run must be a wandb Run"):
        torchmon.WandbEventHandler("run")
    with pytest.raises(TypeError, match=r"^WandbEventHandler\(project\): project must be a str"):
        torchmon.WandbEventHandler(project=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^WandbEventHandler\(name\): name must not be empty"):
        torchmon.WandbEventHandler(name="")
    with pytest.raises(ValueError, match=r"^WandbEventHandler\(max_queue\): max_queue must be"):
        torchmon.WandbEventHandler(max_queue=0, project="p")
    run = wandb.init(project="torchmon-test", name="args")
    try:
        with pytest.raises(
            ValueError, match=r"^WandbEventHandler\(group\): group is for the run the handler"
        ):
            torchmon.WandbEventHandler(run, group="g")
    finally:
        run.finish()


def test_import_rules() -> None:
    code = (
        "import sys, torchmon\n"
        "assert 'wandb' not in sys.modules\n"
        "torchmon.WandbEventHandler\n"
        "assert 'wandb' not in sys.modules\n"
        "sys.modules['wandb'] = None\n"
        "try:\n"
        "    torchmon.WandbEventHandler()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "WandbEventHandler needs W&B" in out.stdout
    assert "pip install '.[wandb]'" in out.stdout


def test_windows_at_exit_delivered(tmp_path: Path) -> None:
    """The handler's run, never closed: the exit delivers the last window
    before wandb's own exit hook finishes the run."""
    code = (
        "import torchmon\n"
        "from datetime import timedelta\n"
        "sink = torchmon.WandbEventHandler(project='torchmon-test')\n"
        "torchmon.register_event_handler(sink)\n"
        "s = torchmon.Stat('a', [torchmon.Aggregation.MEAN], timedelta(hours=1))\n"
        "s.add(4.0)\n"
        "print(sink.run.dir)\n"
    )
    env = {
        **{k: v for k, v in __import__("os").environ.items() if not k.startswith("WANDB_")},
        **OFFLINE_ENV,
        "WANDB_DIR": str(tmp_path),
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    rows = read_history(Path(out.stdout.strip().splitlines()[-1]).parent)
    assert [(r["a.mean"], r[STEP_METRIC]) for r in rows] == [(4, 1)]


def test_forked_child_one_line_counted_bounded(offline_env: Path) -> None:
    """A multiprocessing fork child logging through the parent's handler:
    W&B cannot share the run across a fork, so the child's windows are
    dropped, counted and said in one line; the child ends promptly and the
    parent's run keeps its own windows (docs/sinks.md, "Fork and exit")."""
    code = (
        "import json, multiprocessing, sys, time\n"
        "from datetime import timedelta\n"
        "import torchmon\n"
        "sink = torchmon.WandbEventHandler(project='torchmon-test')\n"
        "torchmon.register_event_handler(sink)\n"
        "s = torchmon.Stat('parent', [torchmon.Aggregation.MEAN], timedelta(hours=1))\n"
        "s.add(1.0)\n"
        "torchmon.flush()\n"
        "def child():\n"
        "    own = torchmon.Stat('child', [torchmon.Aggregation.MEAN], timedelta(hours=1))\n"
        "    for v in (1.0, 2.0, 3.0):\n"
        "        own.add(v)\n"
        "        torchmon.flush()\n"
        "    print(json.dumps({'dropped': sink.dropped, 'pending': sink.pending}), flush=True)\n"
        "p = multiprocessing.get_context('fork').Process(target=child)\n"
        "start = time.monotonic()\n"
        "p.start(); p.join(60)\n"
        "print(json.dumps({'exitcode': p.exitcode, 'seconds': time.monotonic() - start}))\n"
        "print(sink.run.dir)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    child = json.loads(next(line for line in lines if line.startswith('{"dropped"')))
    parent = json.loads(next(line for line in lines if line.startswith('{"exitcode"')))
    assert child == {"dropped": 3, "pending": 0}
    assert parent["exitcode"] == 0 and parent["seconds"] < 30
    line = "this forked child's windows are not sent to W&B (W&B cannot log to a run"
    assert out.stderr.count(line) == 1, out.stderr
    rows = read_history(Path(lines[-1]).parent)
    assert [(r["parent.mean"], r[STEP_METRIC]) for r in rows] == [(1, 1)]
