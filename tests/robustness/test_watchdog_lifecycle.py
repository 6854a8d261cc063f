"""The watchdog's sections, close and exit as a program meets them
(docs/watchdog.md, "The API" and "How the stacks are taken"): sections timed
per thread and nesting in themselves, the hang naming the hung thread's
section, a resumption told even when `close()` follows the beat at once,
exit bounded when a hang handler waits for a lock the exiting thread holds,
no empty dump file on a full disk.

Each scenario runs in a fresh interpreter with a timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

PRELUDE = """
import json, os, sys, threading, time
import torchmon
OUT = sys.argv[1]
events = []
def _record(event):
    if event.name.startswith("torchmon.") or event.name == "torch.monitor.Stat":
        events.append({"name": event.name, "data": {k: v for k, v in event.data.items()
                                                     if isinstance(v, (int, float, str))}})
torchmon.register_event_handler(_record)
def finish(**extra):
    with open(OUT, "w") as f:
        json.dump({"events": events, **extra}, f)
"""


def run_child(
    tmp_path: Path, body: str, timeout: float = 60.0
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], float]:
    out = tmp_path / "out.json"
    code = PRELUDE + textwrap.dedent(body)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(out)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not exit within {timeout} s")
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text()), elapsed


def section_windows(out: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in out["events"]
        if e["name"] == "torch.monitor.Stat" and f"section.{name}.count" in e["data"]
    ]


def test_a_section_nested_in_itself_times_each_level_from_its_own_start(tmp_path: Path) -> None:
    _, out, _ = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=30.0, report_interval=60.0, dump_dir=None)
        with wd.section("A"):
            time.sleep(0.2)
            with wd.section("A"):
                time.sleep(0.01)
        wd.close()
        torchmon.flush()
        finish()
        """,
    )
    (window,) = section_windows(out, "A")
    assert window["section.A.count"] == 2
    # The outer level: its own 0.21 s, not the inner's 0.01 s.
    assert window["section.A.max"] >= 0.2, window


def test_the_same_section_on_two_threads_times_each_threads_own(tmp_path: Path) -> None:
    _, out, _ = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=30.0, report_interval=60.0, dump_dir=None)
        def long():
            with wd.section("A"):
                time.sleep(0.5)
        def short():
            time.sleep(0.2)
            with wd.section("A"):
                time.sleep(0.1)
        threads = [threading.Thread(target=long), threading.Thread(target=short)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        open_after = wd._open_section
        wd.close()
        torchmon.flush()
        finish(open_after=open_after)
        """,
    )
    (window,) = section_windows(out, "A")
    assert window["section.A.count"] == 2
    assert window["section.A.max"] >= 0.5, window
    assert window["section.A.max"] < 0.5 + 0.3, window
    # Both ended: no section is open, so a later hang names none.
    assert out["open_after"] == ""


def test_a_hang_names_the_section_of_the_thread_that_stopped_beating(tmp_path: Path) -> None:
    _, out, _ = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=0.3, first_timeout=0.3, warmup_beats=0,
                               report_interval=60.0, dump_dir=None)
        def loader():
            # Another thread, inside a section of its own throughout the hang.
            with wd.section("data"):
                time.sleep(2.0)
        for _ in range(3):
            with wd.section("compute"):
                time.sleep(0.01)
            wd.beat()
        thread = threading.Thread(target=loader)
        with wd.section("compute"):
            thread.start()
            time.sleep(0.1)
            time.sleep(1.0)  # the main thread's steps stop here
        wd.beat()
        thread.join()
        wd.close()
        finish()
        """,
    )
    hangs = [e["data"] for e in out["events"] if e["name"] == "torchmon.hang"]
    assert hangs and hangs[0]["section"] == "compute", hangs


def test_a_beat_just_before_close_still_gets_its_resumption(tmp_path: Path) -> None:
    _, out, _ = run_child(
        tmp_path,
        """
        wd = torchmon.Watchdog(min_timeout=0.2, first_timeout=0.2, warmup_beats=0,
                               report_interval=60.0, dump_dir=None)
        wd.beat()
        deadline = time.monotonic() + 10
        while not any(e["name"] == "torchmon.hang" for e in events):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        wd.beat()
        wd.close()
        finish()
        """,
    )
    names = [e["name"] for e in out["events"] if e["name"].startswith("torchmon.")]
    assert names == ["torchmon.hang", "torchmon.resumed"], names


def test_exit_ends_when_a_hang_handler_waits_for_a_lock_the_exiting_thread_holds(
    tmp_path: Path,
) -> None:
    proc, _, elapsed = run_child(
        tmp_path,
        """
        lock = threading.Lock()
        reached = threading.Event()
        def on_hang(event):
            if event.name == "torchmon.hang":
                reached.set()
                with lock:
                    pass
        torchmon.register_event_handler(on_hang)
        lock.acquire()  # held by the main thread to the end
        wd = torchmon.Watchdog(min_timeout=0.2, first_timeout=0.2, warmup_beats=0,
                               report_interval=60.0, dump_dir=None)
        wd.beat()
        assert reached.wait(10)
        finish()
        # The exit closes the watchdog, whose report is stuck in on_hang.
        """,
        timeout=60,
    )
    assert elapsed < 30, elapsed
    assert "did not finish within 5 s" in proc.stderr, proc.stderr


def test_a_dump_that_cannot_be_written_leaves_no_empty_file(tmp_path: Path) -> None:
    proc, out, _ = run_child(
        tmp_path,
        """
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        os.makedirs("dumps")
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        wd = torchmon.Watchdog(min_timeout=0.2, first_timeout=0.2, warmup_beats=0,
                               report_interval=60.0, dump_dir="dumps")
        wd.beat()
        time.sleep(0.8)
        wd.beat()
        wd.close()
        files = os.listdir("dumps")
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        finish(files=files)
        """,
    )
    hangs = [e["data"] for e in out["events"] if e["name"] == "torchmon.hang"]
    assert len(hangs) == 1 and hangs[0]["dump"] == "", hangs
    assert out["files"] == [], out["files"]
    assert proc.stderr.count("could not write its dump") == 1, proc.stderr
