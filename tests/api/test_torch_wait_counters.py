"""torchmon.bridge.record_wait_counters(): PyTorch's own wait counters (libc10's
dynamic backend) recorded as torchmon Stats (docs/wait_counter_and_bridge.md).

libc10 looks for the backend once per process, so every scenario runs in a
fresh interpreter (which also catches a crash or a hang, with a timeout).
Runs against the torch 2.13 wheel; skips without torch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from support import clear_torchrun_env, run_python

from torchmon.bridge import _check_backend_abi, record_wait_counters

pytest.importorskip("torch.monitor")

AGGREGATION_SUFFIXES = ("count", "sum", "max", "p50", "p99")


def run_json(code: str, timeout: float = 120.0) -> Any:
    """Runs `code` in a fresh interpreter; returns what it printed last, as JSON."""
    proc = run_python(code, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def windows_of(events: list[dict[str, float]], stat: str) -> list[dict[str, float]]:
    return [e for e in events if f"{stat}.count" in e]


# One child records a whole session (torchmon imported before torch, the
# default 60 s window, a ManualClock for the windows' boundaries) and reports
# each part; the tests below each check one part. A child per test would
# cost CI a torch import (~7 s) each. The guarded durations are compared with
# what the child measured around each block with perf_counter: the two
# clocks differ by the guard's own overhead, far below the 5 ms allowed.
SESSION = """
import json, sys, threading, time
from datetime import timedelta
import prometheus_client, tensorboardX
import torchmon, torchmon.bridge
from torchmon.testing import ManualClock
out = {{}}
torchmon.bridge.record_wait_counters()
import torch
clock = ManualClock(0).__enter__()
torchmon.bridge.record_wait_counters(window_size=timedelta(seconds=60))  # the same: no-op
try:
    torchmon.bridge.record_wait_counters(window_size=5)
except ValueError as exc:
    out["second_call_error"] = str(exc)
events = []
torchmon.register_event_handler(lambda e: events.append(dict(e.data)))
registry = prometheus_client.CollectorRegistry()
writer = tensorboardX.SummaryWriter(logdir={tensorboard!r})
torchmon.register_event_handler(torchmon.JsonlEventHandler({jsonl!r}))
torchmon.register_event_handler(torchmon.PrometheusEventHandler(registry=registry))
tensorboard = torchmon.register_event_handler(torchmon.TensorboardEventHandler(writer))

# A window closed by time reaches the handlers with no flush().
closing = torch.monitor._WaitCounter("closing")
for _ in range(3):
    with closing.guard():
        pass
clock.advance(60_000)
with closing.guard():
    pass
deadline = time.monotonic() + 10
while not events and time.monotonic() < deadline:
    time.sleep(0.01)
out["closed_by_time"] = list(events)

out["measured"] = []
for _ in range(5):
    t0 = time.perf_counter()
    with torch.monitor._WaitCounter("bar.k").guard():
        time.sleep(0.01)
    out["measured"].append(time.perf_counter() - t0)

threads_counter = torch.monitor._WaitCounter("threads")
barrier = threading.Barrier(8)
def work():
    barrier.wait()
    for i in range(500):
        with threads_counter.guard():
            if i % 50 == 0:
                time.sleep(0.001)  # other threads start and stop meanwhile
workers = [threading.Thread(target=work) for _ in range(8)]
for t in workers: t.start()
for t in workers: t.join()

with torch.monitor._WaitCounter("odd key/é").guard():
    pass
torchmon.flush()
out["events"] = events
out["prometheus"] = prometheus_client.generate_latest(registry).decode()
# Unregistered before its writer closes: the exit flush below must not write
# to a closed SummaryWriter, which would open a new event file, in the same
# second under the same name, truncating this one.
torchmon.unregister_event_handler(tensorboard)
writer.close()
print(json.dumps(out), flush=True)

# Daemon threads keep guarding while the interpreter exits: the exit flush
# emits their open window, and nothing crashes (the exit gate).
exit_counter = torch.monitor._WaitCounter("exit.k")
def spin():
    while True:
        with exit_counter.guard():
            time.sleep(0.0005)
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
time.sleep(0.2)
"""


class Session:
    def __init__(self, tmp: Path) -> None:
        pytest.importorskip("prometheus_client")
        pytest.importorskip("tensorboardX")
        self.jsonl = tmp / "events.jsonl"
        self.tensorboard = tmp / "tb"
        self.proc = run_python(
            SESSION.format(jsonl=str(self.jsonl), tensorboard=str(self.tensorboard)),
            timeout=180,
        )
        assert self.proc.stdout, self.proc.stderr[-4000:]
        self.out = json.loads(self.proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(tmp_path_factory.mktemp("wait_counter_session"))


def test_guard_blocks_give_count_and_durations(session: Session) -> None:
    (window,) = windows_of(session.out["events"], "torch.wait_counter.bar.k")
    measured = session.out["measured"]
    assert window["torch.wait_counter.bar.k.count"] == 5
    assert window["torch.wait_counter.bar.k.sum"] == pytest.approx(sum(measured), abs=0.005)
    assert window["torch.wait_counter.bar.k.max"] == pytest.approx(max(measured), abs=0.005)
    assert min(measured) - 0.005 <= window["torch.wait_counter.bar.k.p50"] <= max(measured)
    assert set(window) == {f"torch.wait_counter.bar.k.{s}" for s in AGGREGATION_SUFFIXES}


def test_a_window_closed_by_time_arrives_without_flush(session: Session) -> None:
    assert [w["torch.wait_counter.closing.count"] for w in session.out["closed_by_time"]] == [3]
    # and the guard that closed it is in the next window, emitted by flush()
    closing = windows_of(session.out["events"], "torch.wait_counter.closing")
    assert [w["torch.wait_counter.closing.count"] for w in closing] == [3, 1]


def test_overlapping_guards_from_many_threads_are_all_counted(session: Session) -> None:
    (window,) = windows_of(session.out["events"], "torch.wait_counter.threads")
    assert window["torch.wait_counter.threads.count"] == 8 * 500
    assert window["torch.wait_counter.threads.max"] >= 0.001


def test_a_second_call_keeps_the_window_and_refuses_another(session: Session) -> None:
    error = session.out["second_call_error"]
    assert error.startswith("record_wait_counters(window_size): window_size must match")
    assert "0:01:00" in error


def test_windows_reach_jsonl_prometheus_and_tensorboard(session: Session) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    jsonl = [json.loads(line) for line in session.jsonl.read_text().splitlines()]
    keys = {key for record in jsonl for key in record["data"]}
    assert {"torch.wait_counter.bar.k.count", "torch.wait_counter.odd key/é.p99"} <= keys
    text = session.out["prometheus"]
    count_lines = [
        line for line in text.splitlines() if line.startswith("torch_wait_counter_bar_k_count ")
    ]
    assert count_lines == ["torch_wait_counter_bar_k_count 5.0"]
    # The sink's own name rule (docs/sinks.md) for characters Prometheus does not take.
    assert "torch_wait_counter_odd_key___p99 " in text
    acc = event_accumulator.EventAccumulator(str(session.tensorboard))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    count_tag = next(tag for tag in tags if tag.endswith("bar.k.count"))
    assert [s.value for s in acc.Scalars(count_tag)] == [5.0]


def test_no_crash_at_exit_with_counters_running(session: Session) -> None:
    assert session.proc.returncode == 0, session.proc.stderr[-4000:]
    lines = session.jsonl.read_text().splitlines()
    assert any("torch.wait_counter.exit.k.count" in line for line in lines)


def test_torch_imported_first_and_compile_yields_the_dynamo_counters() -> None:
    out = run_json(
        """
        import json
        import torch
        import torchmon, torchmon.bridge
        torchmon.bridge.record_wait_counters()
        events = []
        torchmon.register_event_handler(lambda e: events.append(dict(e.data)))
        with torch.monitor._WaitCounter("after.torch").guard():
            pass
        compiled = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="eager")
        compiled(torch.ones(4))
        torchmon.flush()
        print(json.dumps(events))
        """,
        timeout=300,
    )
    (guarded,) = windows_of(out, "torch.wait_counter.after.torch")
    assert guarded["torch.wait_counter.after.torch.count"] == 1
    (window,) = windows_of(out, "torch.wait_counter.dynamo_compile")
    assert window["torch.wait_counter.dynamo_compile.count"] == 1
    assert window["torch.wait_counter.dynamo_compile.sum"] > 0


def test_called_after_the_first_counter_it_raises_and_records_nothing() -> None:
    out = run_json(
        """
        import json
        import torch
        torch.monitor._WaitCounter("early")
        import torchmon, torchmon.bridge
        try:
            torchmon.bridge.record_wait_counters()
        except RuntimeError as exc:
            error = str(exc)
        with torch.monitor._WaitCounter("late").guard():
            pass
        print(json.dumps([error, torchmon._core._torch_wait_counter_names()]))
        """
    )
    error, names = out
    assert "too late" in error and "first counter" in error
    assert names == []


@pytest.mark.parametrize(
    ("window_size", "error"),
    [("60", TypeError), (None, TypeError), (0, ValueError), (float("nan"), ValueError)],
)
def test_bad_window_size_names_the_argument(window_size: Any, error: type[Exception]) -> None:
    # Checked before anything is changed, so this process stays clean.
    with pytest.raises(error, match=r"^record_wait_counters\(window_size\): window_size"):
        record_wait_counters(window_size=window_size)


def test_another_backend_abi_is_refused(tmp_path: Path) -> None:
    later = tmp_path / "libc10.so"
    later.write_bytes(b"\0junk\0c10_monitor_wait_counter_dynamic_backend_init_v2\0more")
    with pytest.raises(RuntimeError, match=r"init_v2.*implements.*init_v1"):
        _check_backend_abi([later], "9.9")
    without = tmp_path / "libc10.dylib"
    without.write_bytes(b"\0no hook here\0")
    with pytest.raises(RuntimeError, match=r"torch 2\.0 has no wait counter backend hook"):
        _check_backend_abi([without], "2.0")


def test_the_installed_torch_has_the_supported_abi() -> None:
    import torch

    lib = sorted((Path(torch.__file__).parent / "lib").glob("libc10.*"))
    assert lib
    _check_backend_abi(lib, torch.__version__)  # does not raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GLOO_WORKER = """
import json, os, sys
import torchmon, torchmon.bridge
torchmon.bridge.record_wait_counters(window_size=3600)
import torch
import torch.distributed as dist
events = []
torchmon.register_event_handler(lambda e: events.append(dict(e.data)))
dist.init_process_group("gloo")
for _ in range(3):
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
dist.barrier()
dist.destroy_process_group()
torchmon.flush()
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(events, f)
"""


@pytest.mark.slow
def test_gloo_job_under_torchrun_records_c10d_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_torchrun_env(monkeypatch)
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(GLOO_WORKER))
    torchrun = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            str(worker),
            str(tmp_path),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        log, _ = torchrun.communicate(timeout=180)
    finally:
        if torchrun.poll() is None:
            os.killpg(torchrun.pid, 9)
            torchrun.wait()
    assert torchrun.returncode == 0, log.decode(errors="replace")[-4000:]
    for rank in (0, 1):
        events = json.loads((tmp_path / f"rank{rank}.json").read_text())
        (init,) = windows_of(events, "torch.wait_counter.c10d.init_process_group")
        assert init["torch.wait_counter.c10d.init_process_group.count"] == 1
        # torch 2.13's TCPStore client times its calls (gloo's CPU
        # collectives have no counter of their own).
        assert windows_of(events, "torch.wait_counter.TCPStore__get")


def test_without_torch_it_raises_import_error_and_leaves_nothing_behind() -> None:
    result = run_python(
        """
        import sys
        sys.modules["torch"] = None  # makes `import torch` fail
        import torchmon.bridge
        for window in (60, 5):  # a failed call keeps no window: no ValueError
            try:
                torchmon.bridge.record_wait_counters(window_size=window)
            except ImportError as exc:
                print("ImportError:", exc)
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith(
            "ImportError: torchmon.bridge.record_wait_counters() needs PyTorch (torch.monitor)"
        )
