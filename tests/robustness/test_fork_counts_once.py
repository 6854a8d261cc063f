"""Every sample is logged once across a parent and its forked children
(docs/reliability.md, "fork"): a child's Stats start with empty windows, so
the windows the parent had open at the fork are logged by the parent only,
and what a child adds is logged by that child, once.

Each scenario is a script run in a fresh interpreter with a timeout. Every
process of it logs through the same two handlers, registered in the parent
before any fork: a JSON lines file (what a user reads) and a probe that
appends `{"pid", "count"}` per window to a second file, next to a tally of the
`add` calls each process made, so that the test can say which process logged
what.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest

from torchmon import read_jsonl

TIMEOUT = 120.0

# Imported by the scenario's parent and, through set_forkserver_preload, by
# the forkserver process: both add IMPORT_ADDS samples at import, so the
# forkserver's children inherit an open window too.
_PROBE = r"""
import datetime as dt, json, os
import torchmon as m

OUT = os.environ["PROBE_DIR"]
IMPORT_ADDS = 5

def _append(name, record):
    # one unbuffered O_APPEND write per line: processes never interleave
    fd = os.open(os.path.join(OUT, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)

def _probe(event):
    if event.name == m.STAT_EVENT and "samples.count" in event.data:
        _append("logged.jsonl", {"pid": os.getpid(), "count": event.data["samples.count"]})

if os.environ.get("PROBE_PARENT") == str(os.getpid()) or m._core._handler_count() == 0:
    # Registered in the parent, where every forked child inherits them, and in
    # the forkserver, a fresh interpreter that inherits none: its children
    # log through them. (CPython up to 3.13 ignored the forkserver's sys.path,
    # so the preload of this module failed silently there and each of its
    # children imported it anew; 3.14 preloads it.)
    m.register_event_handler(m.JsonlEventHandler(os.path.join(OUT, "events.jsonl")))
    m.register_event_handler(_probe)

samples = m.Stat("samples", [m.COUNT], dt.timedelta(hours=1))

def add(n, role):
    for _ in range(n):
        samples.add(1.0)
    _append("adds.jsonl", {"pid": os.getpid(), "adds": n, "role": role})

add(IMPORT_ADDS, "import")
"""


def _run(tmp_path: Path, body: str) -> None:
    (tmp_path / "probe.py").write_text(_PROBE)
    script = tmp_path / "scenario.py"
    script.write_text(
        "import os, sys\n"
        "os.environ['PROBE_PARENT'] = str(os.getpid())\n"
        f"os.environ['PROBE_DIR'] = {str(tmp_path)!r}\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import probe\n" + textwrap.dedent(body)
    )
    try:
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the scenario did not finish within {TIMEOUT}s")
    assert proc.returncode == 0, proc.stderr


def _per_process(tmp_path: Path) -> tuple[dict[int, float], dict[int, int], dict[int, set[str]]]:
    logged: dict[int, float] = defaultdict(float)
    adds: dict[int, int] = defaultdict(int)
    roles: dict[int, set[str]] = defaultdict(set)
    for line in (tmp_path / "logged.jsonl").read_text().splitlines():
        record = json.loads(line)
        logged[record["pid"]] += record["count"]
    for line in (tmp_path / "adds.jsonl").read_text().splitlines():
        record = json.loads(line)
        adds[record["pid"]] += record["adds"]
        roles[record["pid"]].add(record["role"])
    return logged, adds, roles


def _file_count(tmp_path: Path) -> float:
    return sum(
        e.data["samples.count"]
        for e in read_jsonl(tmp_path / "events.jsonl")
        if "samples.count" in e.data
    )


def _assert_each_sample_logged_once(tmp_path: Path) -> None:
    logged, adds, roles = _per_process(tmp_path)
    for pid, made in adds.items():
        if roles[pid] == {"import"}:
            # The forkserver process: it never exits through a flush, so its
            # import-time samples may go unlogged; it must not log more.
            assert logged.get(pid, 0.0) <= made, (pid, logged, adds)
        else:
            assert logged.get(pid, 0.0) == made, (pid, roles[pid], dict(logged), dict(adds))
    assert set(logged) <= set(adds)
    assert _file_count(tmp_path) == sum(logged.values())


METHODS = multiprocessing.get_all_start_methods()


@pytest.mark.skipif("fork" not in METHODS, reason="needs fork")
def test_bare_fork_and_multiprocessing_children_do_not_relog_the_parents_window(
    tmp_path: Path,
) -> None:
    """The issue's case: 500 samples in a 1-hour window, then a bare fork
    child that records nothing, one that records 3, a multiprocessing fork
    child and a forkserver child recording 7 each: the parent's samples are
    in the file once."""
    _run(
        tmp_path,
        """
        import multiprocessing as mp, signal

        def work(n):
            probe.add(n, "mp-child")

        if __name__ == "__main__":
            probe.add(500, "parent")
            for n in (0, 3):
                pid = os.fork()
                if pid == 0:
                    signal.alarm(30)
                    probe.add(n, "fork-child")
                    sys.exit(0)   # an ordinary exit: the exit flush runs
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
            methods = ["fork"]
            if "forkserver" in mp.get_all_start_methods():
                methods.append("forkserver")
            for method in methods:
                ctx = mp.get_context(method)
                if method == "forkserver":
                    ctx.set_forkserver_preload(["probe"])
                p = ctx.Process(target=work, args=(7,))
                p.start()
                p.join(60)
                assert p.exitcode == 0, (method, p.exitcode)
        """,
    )
    _assert_each_sample_logged_once(tmp_path)
    # parent 5 + 500; children 0 + 3 + 7 + 7 (the forkserver's 5 at most once)
    assert _file_count(tmp_path) in (5 + 500 + 3 + 7 + 7, 5 + 500 + 3 + 7 + 7 + 5)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or "fork" not in METHODS,
    reason="needs torch and fork",
)
def test_dataloader_fork_workers_log_only_their_own_samples(tmp_path: Path) -> None:
    """A DataLoader of 3 fork workers started after the parent recorded 500
    samples: each worker's file lines hold the items it loaded, the parent's
    500 are logged once."""
    _run(
        tmp_path,
        """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Items(Dataset):
            def __len__(self):
                return 30
            def __getitem__(self, i):
                probe.add(1, "worker")
                return torch.tensor([float(i)])

        if __name__ == "__main__":
            probe.add(500, "parent")
            loader = DataLoader(Items(), batch_size=2, num_workers=3,
                                multiprocessing_context="fork")
            assert sum(len(b) for b in loader) == 30
        """,
    )
    _assert_each_sample_logged_once(tmp_path)
    roles = _per_process(tmp_path)[2]
    assert sum(1 for r in roles.values() if "worker" in r) == 3
    assert _file_count(tmp_path) == 5 + 500 + 30


@pytest.mark.skipif("fork" not in METHODS, reason="needs fork")
def test_wait_counters_and_system_stats_are_not_relogged_by_a_child(tmp_path: Path) -> None:
    """A WaitCounter and a running SystemStats sampler are Stats too: a bare
    fork child that guards twice logs 2 for the counter and no system window
    (its sampler is stopped, docs/reliability.md); the parent logs its own."""
    out = tmp_path / "counts.jsonl"
    script = tmp_path / "scenario.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, signal, sys, time
            import torchmon as m

            def probe(event):
                counts = {{k: v for k, v in event.data.items() if k.endswith(".count")}}
                # SystemStats' Stats have no COUNT: one per system window
                if any(k.startswith("system.") for k in event.data):
                    counts["system windows"] = 1
                line = json.dumps({{"pid": os.getpid(), "counts": counts}}) + "\\n"
                fd = os.open({str(out)!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(fd, line.encode())
                os.close(fd)

            m.register_event_handler(probe)
            counter = m.WaitCounter("wc", 3600)
            for _ in range(50):
                with counter.guard():
                    pass
            sampler = m.SystemStats(0.01, 3600.0, source="proc", gpu=False, io=False).start()
            deadline = time.monotonic() + 30
            while sampler.stats.get("system.memory.usage") is None or (
                sampler.stats["system.memory.usage"].count < 3
            ):
                assert time.monotonic() < deadline, "the sampler took no sample"
                time.sleep(0.01)
            pid = os.fork()
            if pid == 0:
                signal.alarm(30)
                for _ in range(2):
                    with counter.guard():
                        pass
                sys.exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            sampler.close()
            print(os.getpid(), pid)
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    parent, child = (int(x) for x in proc.stdout.split())
    logged: dict[int, dict[str, float]] = {parent: defaultdict(float), child: defaultdict(float)}
    for line in out.read_text().splitlines():
        record = json.loads(line)
        for key, count in record["counts"].items():
            logged[record["pid"]][key] += count
    assert dict(logged[child]) == {"wc.count": 2.0}
    assert logged[parent]["wc.count"] == 50.0
    assert logged[parent]["system windows"] >= 1


_HAS_TORCH = importlib.util.find_spec("torch") is not None

# Four threads make torch wait-counter guards (10 ms windows, so the delivery
# thread is busy much of the time) while the main thread starts and joins
# no-op multiprocessing fork children; every window goes to one JSON lines
# file. Prints the guards made and each child's time from start() to join().
_WAIT_COUNTERS_AND_FORK_CHILDREN = r"""
import json, multiprocessing, sys, threading, time, warnings
import torchmon
from torchmon.bridge import record_wait_counters

warnings.simplefilter("ignore", DeprecationWarning)
record_wait_counters(0.01)
torchmon.register_event_handler(torchmon.JsonlEventHandler(sys.argv[1]))
import torch

counter = torch.monitor._WaitCounter("forked")
made = [0] * 4
stop = threading.Event()

def guard(index):
    while not stop.is_set():
        with counter.guard():
            pass
        made[index] += 1

def child_flush_time(queue):
    started = time.monotonic()
    torchmon.flush()
    queue.put(time.monotonic() - started)

threads = [threading.Thread(target=guard, args=(i,)) for i in range(4)]
for thread in threads:
    thread.start()
context = multiprocessing.get_context("fork")
queue = context.Queue()
exits, flushes = [], []
for _ in range(6):
    time.sleep(0.2)
    started = time.monotonic()
    child = context.Process(target=child_flush_time, args=(queue,))
    child.start()
    child.join(30)
    exits.append(time.monotonic() - started)
    assert child.exitcode == 0, child.exitcode
    flushes.append(queue.get(timeout=5))
time.sleep(0.1)
stop.set()
for thread in threads:
    thread.join()
print(json.dumps({"made": sum(made), "exits": exits, "flushes": flushes}))
"""


@pytest.mark.skipif("fork" not in METHODS, reason="needs fork")
@pytest.mark.skipif(not _HAS_TORCH, reason="needs torch (its wait counters)")
def test_torch_wait_counters_count_each_guard_once_across_fork_children(tmp_path: Path) -> None:
    """A forked child neither re-delivers the windows its parent had queued
    for the delivery thread nor waits for that thread, which it does not
    have: the counts in the shared file equal the guards made, and a child
    that only flushes is done in well under the parent's 2 s exit wait
    (before: 2.4x the guards counted, and 2.0 s per child)."""
    out = tmp_path / "events.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _WAIT_COUNTERS_AND_FORK_CHILDREN, str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    counted = sum(
        e.data["torch.wait_counter.forked.count"]
        for e in read_jsonl(out)
        if "torch.wait_counter.forked.count" in e.data
    )
    assert result["made"] > 10_000
    assert counted == result["made"]
    assert max(result["flushes"]) < 1.0, result
    assert max(result["exits"]) < 1.0, result


@pytest.mark.skipif(not _HAS_TORCH, reason="needs torch (its wait counters)")
def test_a_slow_handler_leaves_at_most_the_queue_capacity_of_wait_counter_windows(
    tmp_path: Path,
) -> None:
    """With a handler slower than the counters close windows, the delivery
    queue holds at most 1,024 windows (the rest dropped, and said so by one
    RuntimeWarning), so the exit, which delivers what is queued, stays
    bounded (before: 2,700 windows queued in 3 s, and an 18 s exit)."""
    code = r"""
import sys, threading, time
import torchmon
from torchmon.bridge import record_wait_counters
record_wait_counters(0.001)
delivered = [0]
def slow(event):
    delivered[0] += 1
    time.sleep(0.01)
torchmon.register_event_handler(slow)
import torch
names = [f"k{i}" for i in range(20)]
counters = [torch.monitor._WaitCounter(n) for n in names]
end = time.monotonic() + 1.5
while time.monotonic() < end:
    for c in counters:
        with c.guard():
            pass
    time.sleep(0.0005)
print("loop done", delivered[0], flush=True)
"""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "wait counter window(s) dropped" in proc.stderr, proc.stderr
    assert proc.stderr.count("RuntimeWarning") == 1, proc.stderr
    # 1,024 windows of a 10 ms handler at most after the loop: ~10 s, not
    # the ~20 s the unbounded queue took for what 20 counters close in 1.5 s.
    assert took < 1.5 + 2 + 1024 * 0.01 + 5, took
