"""torchmon.Watchdog under hostile or failing surroundings (docs/watchdog.md):
a symlink planted in the dump directory, a c10d store that hangs or dies,
signals and section names that are refused, and ranks whose clocks differ.

Every scenario runs in child processes bounded by timeouts and stopped by
pid; stores are real torch TCPStores, ranks real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import free_port, stop_group

# The prelude of every child: the torchmon.* Events it sees, written to OUT
# as JSON at the end (`finish()`).
PRELUDE = """
import json, os, sys, time
import torchmon
OUT = {out!r}
DUMPS = {dumps!r}
events = []
def _record(event):
    if event.name.startswith("torchmon."):
        events.append({{"name": event.name, "data": dict(event.data)}})
torchmon.register_event_handler(_record)
def finish(**extra):
    with open(OUT, "w") as f:
        json.dump({{"events": events, **extra}}, f)
"""


def start_child(
    tmp_path: Path, body: str, env: dict[str, str] | None = None, prelude: bool = True
) -> subprocess.Popen[str]:
    out = tmp_path / "out.json"
    code = PRELUDE.format(out=str(out), dumps=str(tmp_path / "dumps")) if prelude else ""
    code += textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_child(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str, str]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)  # type: ignore[arg-type]
        pytest.fail(f"the child did not exit within {timeout} s")
    finally:
        if proc.poll() is None:
            stop_group(proc)  # type: ignore[arg-type]
    return proc.returncode, stdout, stderr


def run_child(
    tmp_path: Path, body: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[str, dict[str, Any]]:
    code, _, stderr = wait_child(start_child(tmp_path, body, env), timeout)
    assert code == 0, stderr
    return stderr, json.loads((tmp_path / "out.json").read_text())


# -- files written into the dump directory ----------------------------------


def test_a_symlink_planted_at_the_flight_recorder_name_is_not_followed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    stderr, out = run_child(
        tmp_path,
        f"""
        import torch
        import torch.distributed as dist
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
        dist.all_reduce(torch.ones(2))  # an entry for the flight recorder
        os.makedirs(DUMPS)
        # The names are predictable: the first dump of this pid.
        base = os.path.join(DUMPS, f"hang-rank0-pid{{os.getpid()}}-1")
        os.symlink({str(victim)!r}, base + ".flight-recorder.json")
        wd = torchmon.Watchdog(min_timeout=0.3, first_timeout=0.3, warmup_beats=0,
                               dump_dir=DUMPS, report_interval=60.0)
        time.sleep(1.2)
        wd.close()
        dist.destroy_process_group()
        finish(base=base)
        """,
        env={"TORCH_FR_BUFFER_SIZE": "2000"},
    )
    assert victim.read_text() == "precious"
    base = out["base"]
    assert [e["name"] for e in out["events"]] == ["torchmon.hang"]
    assert out["events"][0]["data"]["dump"] == base + ".txt"
    # The hang did write torch's state: the other file, which nobody planted,
    # is there and is a file of its own.
    counters = Path(base + ".wait-counters.json")
    assert counters.is_file() and not counters.is_symlink()
    json.loads(counters.read_text())
    assert os.path.islink(base + ".flight-recorder.json")
    # torchmon's lines: torch's own warnings (gloo's "Unable to resolve
    # hostname" where the host name has no address, as in CI's 3.14 root)
    # are not this test's.
    lines = [line for line in stderr.splitlines() if line.startswith("torchmon")]
    assert lines == [
        f"torchmon: the watchdog could not write {base}.flight-recorder.json: "
        "a file or symlink is already there (left as it is)"
    ], stderr


# -- a store that hangs or dies ---------------------------------------------

SERVER = """
import datetime, sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=300))
print("ready", flush=True)
time.sleep(600)
"""


def start_server(port: int) -> subprocess.Popen[str]:
    """A real c10d TCPStore server in a process of its own (needs torch)."""
    pytest.importorskip("torch")
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert server.stdout is not None
    if server.stdout.readline().strip() != "ready":
        stop_group(server)  # type: ignore[arg-type]
        server.stdout.close()
        pytest.fail("the store server did not start")
    return server


def kill_server(server: subprocess.Popen[str]) -> None:
    if server.poll() is None:
        os.kill(server.pid, signal.SIGKILL)
    server.wait(timeout=30)
    if server.stdout is not None:
        server.stdout.close()


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"no {path.name} within {timeout} s"
        time.sleep(0.02)


# A rank of a 2-rank job (the other never publishes, so every report reads
# the store) whose reporter talks to the store on PORT every 0.5 s.
STORE_CHILD = """
import datetime, os, time
import torchmon
import torch.distributed as dist
PORT = {port}
MARK = {mark!r}
def mark(name):
    open(os.path.join(MARK, name), "w").close()
def marked(name):
    return os.path.exists(os.path.join(MARK, name))
store = dist.TCPStore("127.0.0.1", PORT, is_master=False,
                      timeout=datetime.timedelta(seconds=300))
wd = torchmon.Watchdog(min_timeout=60.0, dump_dir=None, report_interval=0.5, store=store)
def step():
    with wd.section("compute"):
        time.sleep(0.01)
    wd.beat()
"""

RANK_0_OF_2 = {"RANK": "0", "WORLD_SIZE": "2"}


def test_close_is_prompt_while_the_reporter_waits_on_a_hung_store(tmp_path: Path) -> None:
    port = free_port()
    server = start_server(port)
    try:
        child = start_child(
            tmp_path,
            STORE_CHILD.format(port=port, mark=str(tmp_path))
            + """
end = time.monotonic() + 1.2
while time.monotonic() < end:
    step()
mark("ticked")
while not marked("stopped"):
    time.sleep(0.01)
time.sleep(1.2)  # the next report is inside a call to the hung store
started = time.monotonic()
wd.close()
closed_in = time.monotonic() - started
finish(closed_in=closed_in, alive=wd._reporter.is_alive())
""",
            env=RANK_0_OF_2,
        )
        wait_for(tmp_path / "ticked", child)
        os.kill(server.pid, signal.SIGSTOP)
        (tmp_path / "stopped").touch()
        code, _, stderr = wait_child(child, timeout=60.0)
    finally:
        kill_server(server)
    assert code == 0, stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["closed_in"] < 1.0, out
    assert out["alive"] is False, out


def test_exit_is_clean_when_a_hung_store_dies_while_the_interpreter_ends(
    tmp_path: Path,
) -> None:
    port = free_port()
    server = start_server(port)
    try:
        # Never closed: the exit closes it. The last object of __main__ to
        # go waits, once the interpreter is ending, for the store's death:
        # a reporter still inside the store call then returns into an
        # ending interpreter.
        child = start_child(
            tmp_path,
            STORE_CHILD.format(port=port, mark=str(tmp_path))
            + """
end = time.monotonic() + 1.2
while time.monotonic() < end:
    step()
mark("ticked")
while not marked("stopped"):
    time.sleep(0.01)
time.sleep(1.2)
class Last:
    # What it calls is bound here: the modules and builtins are torn down
    # by then.
    def __del__(self, open_=os.open, close=os.close, access=os.access,
                monotonic=time.monotonic, sleep=time.sleep,
                ending=MARK + "/ending", killed=MARK + "/killed",
                create=os.O_CREAT | os.O_WRONLY, exists=os.F_OK):
        close(open_(ending, create))
        deadline = monotonic() + 10
        while not access(killed, exists) and monotonic() < deadline:
            sleep(0.01)
        sleep(0.5)
last = Last()
mark("exiting")
""",
            env=RANK_0_OF_2,
            # No handler of the prelude: a registered function would keep
            # __main__'s globals, and so `last`, alive to the end.
            prelude=False,
        )
        wait_for(tmp_path / "ticked", child)
        os.kill(server.pid, signal.SIGSTOP)
        (tmp_path / "stopped").touch()
        wait_for(tmp_path / "exiting", child)
        started = time.monotonic()
        wait_for(tmp_path / "ending", child)
        kill_server(server)
        (tmp_path / "killed").touch()
        code, _, stderr = wait_child(child, timeout=60.0)
        elapsed = time.monotonic() - started
    finally:
        kill_server(server)
    assert code == 0, stderr
    assert "terminate called" not in stderr
    # The exit's close does not wait out the hung call (5 s before).
    assert elapsed < 4.0, elapsed


# -- refused arguments -------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGSTOP", "SIGCONT", "SIGTSTP", "SIGCHLD",
     "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGPIPE", "SIGALRM", "SIGTTIN"],
)  # fmt: skip
def test_a_dump_signal_that_ends_or_controls_a_process_is_refused(name: str) -> None:
    import torchmon

    with pytest.raises(ValueError) as info:
        torchmon.Watchdog(dump_signal=int(getattr(signal, name)), report_interval=3600.0)
    message = str(info.value)
    assert message.startswith(f"Watchdog(dump_signal): dump_signal is {name}, "), message


def test_sigterm_still_ends_a_process_whose_watchdog_was_refused_it(tmp_path: Path) -> None:
    # Accepted, SIGTERM got faulthandler's handler, and torchrun's SIGTERM
    # then left the rank running.
    child = start_child(
        tmp_path,
        """
        import signal
        try:
            torchmon.Watchdog(dump_signal=signal.SIGTERM, report_interval=3600.0)
        except ValueError:
            pass
        mark = os.path.join(os.path.dirname(OUT), "ready")
        open(mark, "w").close()
        time.sleep(30)
        """,
    )
    wait_for(tmp_path / "ready", child)
    child.send_signal(signal.SIGTERM)
    code, _, stderr = wait_child(child, timeout=10.0)
    assert code == -signal.SIGTERM, stderr


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", ValueError),
        ("  ", ValueError),
        ("a\nb", ValueError),
        ("x" * 193, ValueError),
        (5, TypeError),
        (b"data", TypeError),
    ],
)
def test_a_bad_section_name_is_refused_naming_watchdog_section(
    name: Any, error: type[Exception]
) -> None:
    import torchmon

    with torchmon.Watchdog(dump_dir=None, report_interval=3600.0) as wd:
        with pytest.raises(error) as info:
            wd.section(name)
        assert type(info.value) is error
        assert str(info.value).startswith("Watchdog.section(name): name "), str(info.value)
        # The longest name accepted, and a name refused leaves no section.
        assert wd.section("x" * 192).stat.name == "section." + "x" * 192
        assert name not in wd._sections()


def test_a_dead_store_costs_one_line_per_outage_and_the_individual_score_goes_on(
    tmp_path: Path,
) -> None:
    port = free_port()
    server = start_server(port)
    try:
        child = start_child(
            tmp_path,
            STORE_CHILD.format(port=port, mark=str(tmp_path))
            + """
scores = []
def _scores(event):
    for key in event.data:
        if key.startswith("straggler.compute."):
            scores.append([key, time.monotonic()])
torchmon.register_event_handler(_scores)
def steps_until(name):
    while not marked(name):
        step()
    return time.monotonic()
end = time.monotonic() + 1.2
while time.monotonic() < end:
    step()
mark("ticked")
down = steps_until("killed")
up = steps_until("restarted")
end = time.monotonic() + 4.0
while time.monotonic() < end:
    step()
wd.close()
finish(scores=scores, down=down, up=up)
""",
            env=RANK_0_OF_2,
        )
        wait_for(tmp_path / "ticked", child)
        kill_server(server)
        (tmp_path / "killed").touch()
        time.sleep(3.0)  # six reports
        server = start_server(port)
        (tmp_path / "restarted").touch()
        code, _, stderr = wait_child(child, timeout=60.0)
    finally:
        kill_server(server)
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    ours = [line for line in stderr.splitlines() if line.startswith("torchmon:")]
    assert len(ours) == 2, ours
    assert "rank 0's watchdog cannot reach the c10d store" in ours[0]
    assert "rank 0's watchdog reaches the c10d store again" in ours[1]
    out = json.loads((tmp_path / "out.json").read_text())
    during = [key for key, at in out["scores"] if out["down"] + 0.6 < at < out["up"]]
    assert during.count("straggler.compute.individual.value") >= 3, out
    after = [key for key, at in out["scores"] if at > out["up"] + 1.0]
    assert "straggler.compute.relative.value" in after, out


# -- clocks of two hosts -------------------------------------------------------

CLOCK_RANK = """
import datetime, json, os, sys, time
RANK = int(os.environ["RANK"])
MARK = {mark!r}
def marked(name):
    return os.path.exists(os.path.join(MARK, name))
if RANK == 1:
    # This rank's host clock is 3 s behind rank 0's.
    _real_time = time.time
    time.time = lambda: _real_time() - 3.0
import torch.distributed as dist
import torchmon
seen = []
def _record(event):
    if event.name == "torchmon.stopped_ranks":
        seen.append([event.data["ranks"], marked("stopping")])
torchmon.register_event_handler(_record)
store = dist.TCPStore("127.0.0.1", {port}, is_master=False,
                      timeout=datetime.timedelta(seconds=300))
wd = torchmon.Watchdog(min_timeout=1.5, first_timeout=1.5, warmup_beats=0, dump_dir=None,
                       report_interval=0.5, store=store)
def steps(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
        wd.beat()
if RANK == 1:
    steps(4.0)
    open(os.path.join(MARK, "stopping"), "w").close()
    time.sleep(3.5)  # no beat: rank 0 must see this rank stop
    steps(1.0)
else:
    steps(9.5)
wd.close()
with open(os.path.join(MARK, f"out-{{RANK}}.json"), "w") as f:
    json.dump(seen, f)
"""


def test_a_rank_whose_clock_is_behind_is_not_reported_stopped(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    port = free_port()
    server = start_server(port)
    code = CLOCK_RANK.format(port=port, mark=str(tmp_path))
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(r), "WORLD_SIZE": "2"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for r in range(2)
    ]
    try:
        results = [wait_child(rank, timeout=60.0) for rank in ranks]
    finally:
        kill_server(server)
    for returncode, _, stderr in results:
        assert returncode == 0, stderr
    seen = json.loads((tmp_path / "out-0.json").read_text())
    # Rank 1 is reported when it stopped beating, never before.
    reported = [ranks for ranks, after_stop in seen if ranks]
    assert reported and set(reported) == {"1"}, seen
    assert all(after_stop for ranks, after_stop in seen if ranks), seen
