"""torchmon.Watchdog's hang side (docs/watchdog.md): a hang found in a
sleeping and in a GIL-holding main thread, with the dump naming where it
is, the Events' data, no report for a long first step, a pause, or a forked
child; a clean exit; refused arguments; exit_code; the beat-age gauge while
the GIL is held; and a real torchrun + gloo job with one rank stuck.

Every hang runs in a child process, bounded by a timeout; the timing
assertions are loose (these machines are shared and noisy)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import free_port, stop_group
from support import run_python

import torchmon

# The prelude of every child: the torchmon.* Events it sees, with the type
# of each data value, written to OUT as JSON at the end (`finish()`).
PRELUDE = """
import ctypes, json, os, sys, time
import torchmon
OUT = {out!r}
DUMPS = {dumps!r}
events = []
def _record(event):
    if event.name.startswith("torchmon."):
        data = {{k: [type(v).__name__, v] for k, v in event.data.items()}}
        events.append({{"name": event.name, "data": data, "at": time.monotonic()}})
torchmon.register_event_handler(_record)
def finish(**extra):
    with open(OUT, "w") as f:
        json.dump({{"events": events, **extra}}, f)
"""


def run_child(tmp_path: Path, body: str, timeout: float = 60.0) -> tuple[Any, dict[str, Any]]:
    out = tmp_path / "out.json"
    dumps = tmp_path / "dumps"
    code = PRELUDE.format(out=str(out), dumps=str(dumps)) + textwrap.dedent(body)
    try:
        proc = run_python(code, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not exit within {timeout} s")
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())


def dump_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "dumps").glob("hang-*.txt"))


@pytest.mark.parametrize("how", ["sleep", "gil"])
def test_a_hang_is_reported_with_the_stack_then_its_end(tmp_path: Path, how: str) -> None:
    proc, out = run_child(
        tmp_path,
        f"""
        wd = torchmon.Watchdog(min_timeout=1.0, factor=5.0, first_timeout=5.0,
                               dump_dir=DUMPS, report_interval=60.0)
        for _ in range(20):
            with wd.section("compute"):
                time.sleep(0.01)
            wd.beat()
        timeout = wd.timeout
        def stuck_in_sleep():
            time.sleep(3)
        def stuck_in_c():
            ctypes.PyDLL(None).sleep(3)
        last_beat = time.monotonic()
        with wd.section("compute"):
            {"stuck_in_sleep" if how == "sleep" else "stuck_in_c"}()
        wd.beat()
        time.sleep(0.6)
        timeout_after = wd.timeout
        wd.close()
        finish(timeout=timeout, timeout_after=timeout_after, last_beat=last_beat, pid=os.getpid())
        """,
    )
    function = "stuck_in_sleep" if how == "sleep" else "stuck_in_c"
    names = [e["name"] for e in out["events"]]
    assert names == ["torchmon.hang", "torchmon.resumed"], (names, proc.stderr)
    hang, resumed = out["events"]
    data = hang["data"]
    assert {k: t for k, (t, _) in data.items()} == {
        "rank": "int",
        "stalled_s": "float",
        "beats": "int",
        "section": "str",
        "dump": "str",
        "timeout_s": "float",
    }
    values = {k: v for k, (_, v) in data.items()}
    assert values["rank"] == 0 and values["beats"] == 20 and values["section"] == "compute"
    # The intervals were ~10 ms: factor x p99 is below min_timeout.
    assert out["timeout"] == values["timeout_s"] == 1.0
    # Found within the timeout plus the poll, with room for a loaded machine.
    assert 1.0 < values["stalled_s"] <= 1.0 + 1.0, values
    if how == "sleep":  # the Event arrived when found (with the GIL held: after the call)
        assert hang["at"] - out["last_beat"] < 1.0 + 1.5
    (dump,) = dump_files(tmp_path)
    assert values["dump"] == str(dump)
    assert dump.name == f"hang-rank0-pid{out['pid']}-1.txt"
    text = dump.read_text()
    assert text.startswith(f"torchmon watchdog: rank 0 (pid {out['pid']}) made no step for")
    assert 'in section "compute", after 20 steps' in text
    # The main thread's innermost frame is the function it hangs in.
    main = text.split("(most recent call first):\n")[-1]
    assert main.splitlines()[0].endswith(f" in {function}"), text
    assert resumed["data"]["beats"] == ["int", 21]
    assert resumed["data"]["stalled_s"][0] == "float"
    assert 2.5 < resumed["data"]["stalled_s"][1] < 10
    # The hang's 3 s is not a step time: kept, it would make the timeout 15 s.
    assert out["timeout_after"] == 1.0


def test_a_long_first_step_and_a_pause_are_not_hangs(tmp_path: Path) -> None:
    _, out = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=0.5, factor=2.0, dump_dir=DUMPS, report_interval=60.0)
        assert wd.timeout == 300.0  # first_timeout's default: max(10 x 0.5, 300)
        time.sleep(1.5)  # the first step compiles
        wd.beat()
        time.sleep(1.0)
        wd.beat()
        for _ in range(10):
            time.sleep(0.01)
            wd.beat()
        assert wd.timeout == 0.5, wd.timeout
        with wd.paused():
            time.sleep(1.5)
            assert wd.seconds_since_beat == 0.0
        for _ in range(5):
            time.sleep(0.01)
            wd.beat()
        assert wd.timeout == 0.5, wd.timeout  # the paused interval was not kept
        time.sleep(0.2)
        wd.close()
        finish()
        """,
    )
    assert out["events"] == []
    assert dump_files(tmp_path) == []


def test_a_forked_child_that_does_not_beat_reports_nothing(tmp_path: Path) -> None:
    _, out = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=0.5, first_timeout=0.5, warmup_beats=0,
                               dump_dir=DUMPS, report_interval=60.0)
        for _ in range(10):
            time.sleep(0.01)
            wd.beat()
        pid = os.fork()
        if pid == 0:
            time.sleep(2.0)  # 4 timeouts without a beat
            wd.close()  # returns: the thread is the parent's
            with open(OUT + ".child", "w") as f:
                json.dump(events, f)
            os._exit(0)
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            time.sleep(0.02)
            wd.beat()
        _, status = os.waitpid(pid, 0)
        wd.close()
        finish(status=status, child=pid, parent=os.getpid())
        """,
    )
    assert out["status"] == 0
    assert out["events"] == []
    assert json.loads((tmp_path / "out.json.child").read_text()) == []
    assert dump_files(tmp_path) == []


def test_dataloader_workers_report_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _, out = run_child(
        tmp_path,
        """
        import torch.utils.data
        class Slow(torch.utils.data.Dataset):
            def __len__(self):
                return 24
            def __getitem__(self, i):
                time.sleep(0.25)  # each worker lives ~3 s without a beat
                return os.getpid()
        wd = torchmon.Watchdog(min_timeout=1.0, first_timeout=1.0, warmup_beats=0,
                               dump_dir=DUMPS, report_interval=60.0)
        for _ in range(5):
            time.sleep(0.01)
            wd.beat()
        workers = set()
        # Forked workers (the default before 3.14, which defaults to
        # forkserver; a class of this -c script cannot be pickled for that):
        # they inherit the parent's Watchdog, which must stay silent there.
        loader = torch.utils.data.DataLoader(
            Slow(), batch_size=1, num_workers=2, multiprocessing_context="fork"
        )
        for batch in loader:
            workers.add(int(batch[0]))
            wd.beat()
        wd.close()
        finish(workers=sorted(workers), parent=os.getpid())
        """,
        timeout=120.0,
    )
    assert len(out["workers"]) == 2 and out["parent"] not in out["workers"]
    assert out["events"] == []
    assert dump_files(tmp_path) == []


def test_exit_is_prompt_with_a_watchdog_never_closed(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = run_python(
        """
        import time, torchmon
        wd = torchmon.Watchdog(min_timeout=1.0, report_interval=0.5)
        with wd.section("step"):
            wd.beat()
        time.sleep(0.7)  # a report tick ran
        """,
        timeout=30.0,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert time.monotonic() - started < 15.0


NAN = math.nan
INF = math.inf


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"min_timeout": 0}, ValueError, "min_timeout"),
        ({"min_timeout": -1.0}, ValueError, "min_timeout"),
        ({"min_timeout": NAN}, ValueError, "min_timeout"),
        ({"min_timeout": INF}, ValueError, "min_timeout"),
        ({"min_timeout": "10"}, TypeError, "min_timeout"),
        ({"min_timeout": True}, TypeError, "min_timeout"),
        ({"factor": 0}, ValueError, "factor"),
        ({"factor": NAN}, ValueError, "factor"),
        ({"factor": -INF}, ValueError, "factor"),
        ({"factor": "5"}, TypeError, "factor"),
        ({"min_timeout": 10.0, "max_timeout": 5.0}, ValueError, "max_timeout"),
        ({"max_timeout": NAN}, ValueError, "max_timeout"),
        ({"max_timeout": "60"}, TypeError, "max_timeout"),
        ({"first_timeout": 0.0}, ValueError, "first_timeout"),
        ({"first_timeout": INF}, ValueError, "first_timeout"),
        ({"first_timeout": [1]}, TypeError, "first_timeout"),
        ({"report_interval": 0}, ValueError, "report_interval"),
        ({"report_interval": NAN}, ValueError, "report_interval"),
        ({"report_interval": -1}, ValueError, "report_interval"),
        ({"report_interval": None}, TypeError, "report_interval"),
        ({"warmup_beats": -1}, ValueError, "warmup_beats"),
        ({"warmup_beats": 2**70}, ValueError, "warmup_beats"),
        ({"warmup_beats": 1.5}, TypeError, "warmup_beats"),
        ({"warmup_beats": True}, TypeError, "warmup_beats"),
        ({"exit_code": 256}, ValueError, "exit_code"),
        ({"exit_code": -1}, ValueError, "exit_code"),
        ({"exit_code": "3"}, TypeError, "exit_code"),
        ({"exit_code": 3.0}, TypeError, "exit_code"),
        ({"dump_dir": 5}, TypeError, "dump_dir"),
        ({"dump_signal": "SIGUSR1"}, TypeError, "dump_signal"),
        ({"dump_signal": 0}, ValueError, "dump_signal"),
        ({"dump_signal": 1000}, ValueError, "dump_signal"),
        ({"dump_signal": int(signal.SIGKILL)}, ValueError, "dump_signal"),
    ],
)
def test_bad_arguments_are_refused_naming_them(
    kwargs: dict[str, Any], error: type[Exception], argument: str
) -> None:
    with pytest.raises(error) as info:
        torchmon.Watchdog(**kwargs)
    assert type(info.value) is error
    assert str(info.value).startswith(f"Watchdog({argument}): {argument} "), str(info.value)


def test_a_dump_signal_with_a_handler_of_the_user_is_refused(tmp_path: Path) -> None:
    _, out = run_child(
        tmp_path,
        """
        import signal
        refused = []
        for sig in (signal.SIGRTMAX - 2, signal.SIGUSR1):
            signal.signal(sig, lambda *a: None)
            try:
                torchmon.Watchdog(dump_signal=None if sig != signal.SIGUSR1 else sig)
            except ValueError as exc:
                refused.append(str(exc))
        finish(refused=refused)
        """,
    )
    assert len(out["refused"]) == 2, out
    for message in out["refused"]:
        assert message.startswith("Watchdog(dump_signal): dump_signal is signal "), message
        assert "already has a handler" in message


def test_an_unwritable_dump_dir_costs_one_line_and_the_event_still_goes(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc, out = run_child(
        tmp_path,
        f"""
        wd = torchmon.Watchdog(min_timeout=0.3, first_timeout=0.3, warmup_beats=0,
                               dump_dir={str(blocker / "dumps")!r}, report_interval=60.0)
        time.sleep(1.0)
        wd.close()
        finish()
        """,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "could not write its dump" in lines[0], proc.stderr
    (hang,) = out["events"]
    assert hang["name"] == "torchmon.hang"
    assert hang["data"]["dump"] == ["str", ""]


def test_without_torch_a_python_loop_is_watched(tmp_path: Path) -> None:
    _, out = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=0.5, first_timeout=0.5, warmup_beats=0,
                               dump_dir=DUMPS, report_interval=0.5)
        for _ in range(10):
            with wd.section("work"):
                time.sleep(0.01)
            wd.beat()
        time.sleep(1.5)
        wd.beat()
        time.sleep(0.3)
        wd.close()
        finish(torch="torch" in sys.modules)
        """,
    )
    assert out["torch"] is False
    assert [e["name"] for e in out["events"]] == ["torchmon.hang", "torchmon.resumed"]
    assert len(dump_files(tmp_path)) == 1


@pytest.mark.parametrize("how", ["sleep", "gil"])
def test_exit_code_ends_a_hung_process(tmp_path: Path, how: str) -> None:
    sink = tmp_path / "events.jsonl"
    stuck = "time.sleep(60)" if how == "sleep" else "ctypes.PyDLL(None).sleep(60)"
    code = f"""
        import ctypes, time, torchmon
        torchmon.register_event_handler(torchmon.JsonlEventHandler({str(sink)!r}))
        wd = torchmon.Watchdog(min_timeout=0.5, first_timeout=0.5, warmup_beats=0,
                               dump_dir={str(tmp_path / "dumps")!r}, exit_code=3)
        for _ in range(5):
            time.sleep(0.01)
            wd.beat()
        {stuck}
        """
    started = time.monotonic()
    proc = run_python(code, timeout=40.0)
    elapsed = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    assert len(dump_files(tmp_path)) == 1
    if how == "sleep":
        assert elapsed < 15.0
        assert "exiting with code 3" in proc.stderr
        lines = [json.loads(line) for line in sink.read_text().splitlines()]
        assert any(line.get("name") == "torchmon.hang" for line in lines), lines
    else:
        # The GIL never comes back: the core exits after its grace period.
        assert "did not finish within 10 s" in proc.stderr
        assert elapsed < 30.0


def scrape_gauge(port: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(r"^torchmon_watchdog_seconds_since_beat(?:\{[^}]*\})? (\S+)$", text, re.M)
    return None if match is None else float(match.group(1))


def test_the_gauge_grows_while_the_main_thread_holds_the_gil(tmp_path: Path) -> None:
    ready = tmp_path / "port"
    code = f"""
        import ctypes, time, torchmon
        sink = torchmon.PrometheusEventHandler.serve(port_base=0)
        torchmon.register_event_handler(sink)
        wd = torchmon.Watchdog(min_timeout=30.0, report_interval=60.0)
        for _ in range(5):
            time.sleep(0.01)
            wd.beat()
        with open({str(ready)!r} + ".tmp", "w") as f:
            f.write(str(sink.port))
        import os
        os.rename({str(ready)!r} + ".tmp", {str(ready)!r})
        ctypes.PyDLL(None).sleep(6)
        """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, proc.returncode
            assert time.monotonic() < deadline
            time.sleep(0.05)
        port = int(ready.read_text())
        time.sleep(1.0)
        # This process scrapes: the hung one's GIL is not needed.
        first = scrape_gauge(port)
        time.sleep(1.5)
        second = scrape_gauge(port)
        assert proc.poll() is None  # still in the C call
        assert first is not None and second is not None
        assert 0.5 < first < second, (first, second)
        assert second - first > 1.0
    finally:
        stop_group(proc)


RANK_SCRIPT = """
import ctypes, datetime, os, sys, time
import torch
import torch.distributed as dist
import torchmon
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
torchmon.register_event_handler(torchmon.JsonlEventHandler(f"events-{rank}.jsonl"))
wd = torchmon.Watchdog(min_timeout=2.0, factor=5.0, dump_dir="dumps", exit_code=3,
                       report_interval=60.0)
def stuck_rank_waits():
    if sys.argv[1] == "sleep":
        time.sleep(90)
    else:
        ctypes.PyDLL(None).sleep(90)
t = torch.ones(4)
for step in range(200):
    if step == 20 and rank == dist.get_world_size() - 1:
        stuck_rank_waits()
    with wd.section("allreduce"):
        dist.all_reduce(t)
    wd.beat()
    time.sleep(0.01)
print("unreachable", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sleep", "gil"])
def test_torchrun_one_stuck_rank_every_rank_dumps(tmp_path: Path, how: str) -> None:
    pytest.importorskip("torch")
    ranks = 2
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    log_path = tmp_path / "torchrun.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000"}
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={ranks}",
                "--master-addr=127.0.0.1",
                f"--master-port={free_port()}",
                str(script),
                how,
            ],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not end within 90 s:\n" + log_path.read_text()[-3000:])
        finally:
            stop_group(proc)
    elapsed = time.monotonic() - started
    output = log_path.read_text(errors="replace")
    assert proc.returncode != 0, output[-3000:]
    assert elapsed < 90  # well before the process group's 120 s
    dumps = {
        int(m.group(1)): path
        for path in (tmp_path / "dumps").glob("hang-rank*.txt")
        if (m := re.match(r"hang-rank(\d+)-", path.name))
    }
    assert sorted(dumps) == list(range(ranks)), (sorted(dumps), output[-3000:])
    stuck = dumps[ranks - 1].read_text()
    assert "in stuck_rank_waits" in stuck, stuck
    for rank in range(ranks - 1):
        text = dumps[rank].read_text()
        assert re.search(r"torch/distributed/.* in all_reduce", text), text
        assert 'in section "allreduce"' in text
        fr = dumps[rank].with_suffix(".flight-recorder.json")
        assert fr.exists(), output[-3000:]
        assert dumps[rank].with_suffix(".wait-counters.json").exists()
        # The rank's Event reached its JSONL before the exit.
        lines = (tmp_path / f"events-{rank}.jsonl").read_text().splitlines()
        assert any(json.loads(line)["name"] == "torchmon.hang" for line in lines)
    assert "exiting with code 3" in output


def test_a_gil_held_hang_right_after_a_resumption_is_dumped_on_time(tmp_path: Path) -> None:
    # The resumption's Event waits for the GIL the next hang holds: the
    # watchdog's thread must not wait with it.
    _, out = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=0.5, max_timeout=0.5, first_timeout=0.5,
                               warmup_beats=0, dump_dir=DUMPS, report_interval=60.0)
        for _ in range(5):
            time.sleep(0.01)
            wd.beat()
        time.sleep(0.8)  # a first hang
        wd.beat()  # resumed: reported within the next 100 ms poll
        ctypes.PyDLL(None).sleep(2)  # at once, a hang holding the GIL
        wd.beat()
        time.sleep(0.5)
        wd.close()
        finish()
        """,
    )
    names = [e["name"] for e in out["events"]]
    assert names == ["torchmon.hang", "torchmon.resumed"] * 2, names
    second = out["events"][2]["data"]
    # Found during the C call, not after it returned.
    assert second["stalled_s"][1] < 1.5, second
    assert len(dump_files(tmp_path)) == 2


def test_two_watchdogs_each_report_and_never_share_or_overwrite_a_dump(tmp_path: Path) -> None:
    _, out = run_child(
        tmp_path,
        """
        os.makedirs(DUMPS)
        # A dump of an earlier process with this pid (a restarted container).
        old = os.path.join(DUMPS, f"hang-rank0-pid{os.getpid()}-1.txt")
        with open(old, "w") as f:
            f.write("earlier")
        a = torchmon.Watchdog(min_timeout=0.3, first_timeout=0.3, warmup_beats=0,
                              dump_dir=DUMPS, report_interval=60.0)
        b = torchmon.Watchdog(min_timeout=0.3, first_timeout=0.3, warmup_beats=0,
                              dump_dir=DUMPS, report_interval=60.0)
        def neither_beats():
            time.sleep(1.0)
        neither_beats()
        a.close()
        b.close()
        finish(old=open(old).read())
        """,
    )
    hangs = [e["data"]["dump"][1] for e in out["events"] if e["name"] == "torchmon.hang"]
    assert len(hangs) == 2 and len(set(hangs)) == 2, hangs
    assert out["old"] == "earlier"
    for dump in hangs:
        assert " in neither_beats\n" in Path(dump).read_text()
    assert len(dump_files(tmp_path)) == 3
