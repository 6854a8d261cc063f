"""What the torchmon command does with input that is no ordinary log file:
a line without end (/dev/zero), a FIFO without a writer, a pipe, NaN
values, control characters in names (docs/cli.md, "Input"). Run as a user
runs it: the console script in a subprocess, with a timeout wherever a hang
is the failure, and an address-space limit wherever unbounded memory is."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from torchmon.cli import _common, main

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/dev/zero, mkfifo and /proc/self/fd"
)

#: The console script beside this Python (the venv's), as a user calls it.
TORCHMON = str(Path(sys.executable).with_name("torchmon"))
#: A child that reads its input whole dies of MemoryError under this limit
#: instead of taking the machine's memory (reading /dev/zero unbounded took
#: 24 GB and the OOM killer); the command itself needs far less.
ADDRESS_SPACE = 2 << 30


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    max_rss_mb: float


#: Runs argv[4:] with stdout to argv[1], stderr to argv[2], its address space
#: limited, killed after argv[3] seconds; prints its exit code and peak RSS
#: (KiB). A child of this small process, because a process's peak RSS
#: starts at its parent's when it is forked (Linux keeps the high-water mark
#: across exec), and pytest's is over 100 MB.
_MEASURE = f"""
import os, resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))
with open(sys.argv[1], "wb") as out, open(sys.argv[2], "wb") as err:
    proc = subprocess.Popen(sys.argv[4:], stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    try:
        proc.wait(float(sys.argv[3]))
    except subprocess.TimeoutExpired:
        proc.kill()
        print("timeout")
        sys.exit()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(proc.returncode, usage.ru_maxrss)
"""


def run_measured(*args: str, timeout: float = 60.0, tmp: Path) -> Run:
    """Runs ``torchmon ARGS`` and measures its peak RSS; fails the test if
    it runs for over ``timeout`` seconds."""
    out_path, err_path = tmp / "stdout.txt", tmp / "stderr.txt"
    measure = [sys.executable, "-I", "-c", _MEASURE, str(out_path), str(err_path)]
    result = subprocess.run(
        [*measure, str(timeout), TORCHMON, *args],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        check=True,
    )
    assert result.stdout != "timeout\n", f"torchmon {' '.join(args)} ran for over {timeout} s"
    returncode, max_rss_kib = map(int, result.stdout.split())
    return Run(
        returncode,
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        max_rss_kib / 1024,
    )


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TORCHMON, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def event_line(name: str, data: dict[str, object], second: int = 0) -> str:
    record = {"name": name, "timestamp": f"2024-01-01T00:00:{second:02d}", "data": data}
    return json.dumps(record, ensure_ascii=False) + "\n"


STAT = "torch.monitor.Stat"


@pytest.fixture
def small_log(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text(
        "".join(event_line(STAT, {"train.loss.mean": 2.0 - i}, i) for i in range(3)),
        encoding="utf-8",
    )
    return path


# --- a line without end ------------------------------------------------------


def test_summarize_dev_zero_is_refused_at_the_line_cap_in_bounded_memory(tmp_path: Path) -> None:
    run = run_measured("summarize", "/dev/zero", tmp=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        "torchmon summarize: /dev/zero:1: a line longer than 16 MiB, the longest a "
        "JSON-lines log may hold: not a JSON-lines log"
    ]
    assert run.max_rss_mb < 100, run.max_rss_mb


def test_summarize_a_64_mib_line_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    # A line that starts as an event and never ends within the cap.
    log = tmp_path / "long.jsonl"
    with log.open("wb") as file:
        file.write(event_line(STAT, {"a.mean": 1.0}).encode())
        file.write(b'{"name": "' + b"a" * (64 << 20) + b'"}\n')
        file.write(event_line(STAT, {"a.mean": 2.0}).encode())
    for strict in ((), ("--strict",)):
        run = run_measured("summarize", str(log), *strict, tmp=tmp_path)
        assert run.returncode == 2, run.stderr
        assert len(run.stderr.splitlines()) == 1, run.stderr
        assert f"{log}:2: a line longer than 16 MiB" in run.stderr
        assert run.max_rss_mb < 100, run.max_rss_mb


def test_a_line_just_under_the_cap_is_read(tmp_path: Path) -> None:
    """The cap refuses no log JsonlEventHandler writes: a line of 16 MiB less
    a few bytes is an event like any other."""
    log = tmp_path / "wide.jsonl"
    head = event_line("big", {"text": ""})
    filler = _common._MAX_LINE_BYTES - len(head.encode())
    log.write_text(event_line("big", {"text": "x" * filler}), encoding="utf-8")
    assert log.stat().st_size == _common._MAX_LINE_BYTES
    result = run_cli("summarize", str(log))
    assert result.returncode == 0, result.stderr[:500]
    assert result.stdout.startswith("no Stat events"), result.stdout[:200]


def test_the_cap_counts_the_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    line = event_line(STAT, {"a.mean": 1.0})
    log = tmp_path / "events.jsonl"
    log.write_text(line * 2, encoding="utf-8")
    monkeypatch.setattr(_common, "_MAX_LINE_BYTES", len(line))
    assert main(["summarize", "--strict", str(log)]) == 0
    assert "  2  " in capsys.readouterr().out  # two windows
    monkeypatch.setattr(_common, "_MAX_LINE_BYTES", len(line) - 1)
    assert main(["summarize", str(log)]) == 2
    assert f"{log}:1: a line longer than" in capsys.readouterr().err


def test_to_tensorboard_dev_zero_is_refused_and_leaves_no_logdir(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    logdir = tmp_path / "new" / "tb"
    run = run_measured("to-tensorboard", "/dev/zero", str(logdir), tmp=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        "torchmon to-tensorboard: /dev/zero:1: a line longer than 16 MiB, the longest a "
        "JSON-lines log may hold: not a JSON-lines log"
    ]
    assert not (tmp_path / "new").exists()
    # The reading itself adds at most two copies of the cap: tensorboardX's
    # `import torch` is most of the rest.
    baseline = run_measured(
        "to-tensorboard", str(write_small(tmp_path)), str(tmp_path / "base"), tmp=tmp_path
    )
    assert baseline.returncode == 0, baseline.stderr
    assert run.max_rss_mb - baseline.max_rss_mb < 2 * 16 + 16, (run, baseline)


def test_to_tensorboard_a_long_line_leaves_an_existing_logdir_as_it_was(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    logdir = tmp_path / "tb"
    logdir.mkdir()
    (logdir / "notes.txt").write_text("mine")
    log = tmp_path / "long.jsonl"
    with log.open("wb") as file:
        file.write(event_line(STAT, {"a.mean": 1.0}).encode() * 100)
        file.write(b"{" * (20 << 20))
    run = run_measured("to-tensorboard", str(log), str(logdir), "--append", tmp=tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"{log}:101: a line longer than 16 MiB" in run.stderr
    assert sorted(p.name for p in logdir.iterdir()) == ["notes.txt"]


def write_small(tmp_path: Path) -> Path:
    path = tmp_path / "small.jsonl"
    path.write_text(event_line(STAT, {"a.mean": 1.0}), encoding="utf-8")
    return path


# --- FIFOs and pipes -----------------------------------------------------------


def test_summarize_a_fifo_without_writer_exits_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    result = run_cli("summarize", str(fifo), timeout=20)
    assert time.monotonic() - started < 15
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"torchmon summarize: {fifo}: a FIFO that no program has open for writing: "
        "start its writer first, or give a program's output as <(program)"
    ]


def test_to_tensorboard_a_fifo_without_writer_exits_at_once_and_makes_no_logdir(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = run_cli("to-tensorboard", str(fifo), str(tmp_path / "tb"), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "a FIFO that no program has open for writing" in result.stderr
    assert not (tmp_path / "tb").exists()


def test_summarize_a_fifo_whose_writer_writes_late(tmp_path: Path, small_log: Path) -> None:
    """A writer that has the FIFO open but writes only later is waited for."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with fifo.open("wb") as file:  # blocks until torchmon opens it
            time.sleep(0.5)
            file.write(small_log.read_bytes())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(0.2)
    result = run_cli("summarize", str(fifo), timeout=20)
    writer.join(5)
    assert result.returncode == 0, result.stderr
    assert "train.loss" in result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(...)")
@pytest.mark.parametrize("producer", ["cat {log}", "sleep 0.5; cat {log}", "gzip -c {log} | zcat"])
def test_summarize_a_process_substitution(small_log: Path, producer: str) -> None:
    command = f"{TORCHMON} summarize <({producer.format(log=small_log)})"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "train.loss" in result.stdout
    assert result.stderr == ""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(...)")
def test_summarize_an_empty_process_substitution_is_a_log_without_events() -> None:
    result = subprocess.run(
        ["bash", "-c", f"{TORCHMON} summarize <(true)"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(": no events\n")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for <(...)")
def test_a_foreign_file_through_a_pipe_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", "-c", f"{TORCHMON} summarize <(printf 'a,b,c\\n1,2,3')"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert "not a JSON-lines log" in result.stderr


# --- NaN values ----------------------------------------------------------------


def test_to_tensorboard_says_once_how_many_values_were_nan_or_infinite(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    log = tmp_path / "nan.jsonl"
    log.write_text(
        "".join(
            event_line(
                STAT,
                {"a.mean": {"$float": "nan"}, "b.max": {"$float": "inf"}, "c.min": 1.0},
                i,
            )
            for i in range(40)
        ),
        encoding="utf-8",
    )
    result = run_cli("to-tensorboard", str(log), str(tmp_path / "tb"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wrote 120 scalars")
    assert result.stderr.splitlines() == [
        "torchmon to-tensorboard: 80 values were NaN or infinite; written as they are"
    ]


def test_to_tensorboard_without_nan_says_nothing_of_it(tmp_path: Path, small_log: Path) -> None:
    pytest.importorskip("tensorboardX")
    result = run_cli("to-tensorboard", str(small_log), str(tmp_path / "tb"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


# --- control characters --------------------------------------------------------


def test_summarize_escapes_control_characters_of_names_and_data(tmp_path: Path) -> None:
    log = tmp_path / "evil.jsonl"
    log.write_text(
        event_line(STAT, {"evil\x1b[2J\x9b31m\x7f.mean": 1.0, "naïve_ünïcode_名前.mean": 2.0})
        + event_line("ev\x1b]0;title\x07", {"k\x1b[1m": "v\x1b[2J", "t\tn\n": 1}),
        encoding="utf-8",
    )
    result = run_cli("summarize", str(log))
    assert result.returncode == 0, result.stderr
    for control in ("\x1b", "\x9b", "\x07", "\x7f"):
        assert control not in result.stdout
    assert "evil\\x1b[2J\\x9b31m\\x7f  mean" in result.stdout
    assert "naïve_ünïcode_名前" in result.stdout
    assert "ev\\x1b]0;title\\x07" in result.stdout
    assert "k\\x1b[1m='v\\x1b[2J'" in result.stdout
    assert "t\\tn\\n=1" in result.stdout
    # The columns line up: escaped names are measured as printed.
    stat_lines = result.stdout.split("\n\n")[0].splitlines()
    assert len({line.index("mean") for line in stat_lines[1:]}) == 1


def test_error_messages_escape_control_characters(tmp_path: Path) -> None:
    missing = tmp_path / "x\x1b[2J.jsonl"
    result = run_cli("summarize", str(missing))
    assert result.returncode == 2
    assert "\x1b" not in result.stderr
    assert "x\\x1b[2J.jsonl: no such file" in result.stderr

    torn = tmp_path / "torn.jsonl"
    bad = json.dumps({"name": "x", "timestamp": "\x1b[2J", "data": {}})
    torn.write_text(event_line(STAT, {"a.mean": 1.0}) + bad + "\n", encoding="utf-8")
    for strict in ((), ("--strict",)):
        result = run_cli("summarize", str(torn), *strict)
        assert "\x1b" not in result.stderr, result.stderr


# --- Ctrl-C --------------------------------------------------------------------


def wait_until_open(pid: int, path: Path, timeout: float = 30.0) -> None:
    """Waits until process ``pid`` has ``path`` open (its /proc/PID/fd)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == str(path):
                    return
            except OSError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"{pid} did not open {path} within {timeout} s")


@pytest.mark.parametrize("command", ["summarize", "to-tensorboard"])
def test_ctrl_c_while_waiting_for_a_pipe_exits_130_in_one_line(
    tmp_path: Path, command: str
) -> None:
    if command == "to-tensorboard":
        pytest.importorskip("tensorboardX")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    logdir = tmp_path / "tb"
    args = [str(fifo)] + ([str(logdir)] if command == "to-tensorboard" else [])
    # This process has the FIFO open for writing, and writes nothing.
    held = os.open(fifo, os.O_RDWR)
    try:
        # SIGINT's default action, as at a terminal: a shell starting this
        # test run in the background (CI's other interpreters) leaves SIGINT
        # ignored, and Python then never raises KeyboardInterrupt.
        proc = subprocess.Popen(
            [TORCHMON, command, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        with proc:
            try:
                wait_until_open(proc.pid, fifo)
                # At once: to-tensorboard imports tensorboardX (and torch, whose
                # import a Ctrl-C aborts in C++) before it opens its input.
                time.sleep(0.05)
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=30)
            finally:
                proc.kill()
    finally:
        os.close(held)
    assert proc.returncode == 130, err
    assert err.splitlines() == [f"torchmon {command}: interrupted"]
    assert not logdir.exists()
