"""TensorboardEventHandler.logdir: torchmon's own event-file writer
(crates/torchmon-core/src/tensorboard/), read back by TensorBoard's own
loader (EventAccumulator) and compared with the JSON-lines log of the same
run; histograms of the distributions; what a SIGKILL, a fork, a second
process and a full disk leave (docs/sinks.md, "TensorBoard")."""

from __future__ import annotations

import math
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support import emit_open_windows, registered

import torchmon
from torchmon import Aggregation, JsonlEventHandler, Stat, TensorboardEventHandler, read_jsonl

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
pywrap = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")

P_AGGS = [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT, Aggregation.P50, Aggregation.P99]


def accumulator(path: Path, purge: bool = True) -> Any:
    """TensorBoard's own loader over ``path`` (a directory or one file),
    keeping every point (its default keeps a sample of them)."""
    acc = event_accumulator.EventAccumulator(
        str(path),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0},
        purge_orphaned_data=purge,
    )
    acc.Reload()
    return acc


def scalars(acc: Any) -> dict[str, list[tuple[int, float]]]:
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def f32(value: float) -> float:
    """``value`` as TensorBoard stores a scalar (float32)."""
    if math.isnan(value) or math.isinf(value):
        return value
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def jsonl_windows(path: Path) -> list[tuple[dict[str, Any], Any]]:
    return [
        (dict(e.data), d)
        for e, d in read_jsonl(path, distributions=True)
        if e.name == torchmon.STAT_EVENT
    ]


def expected_from_jsonl(
    path: Path,
) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[tuple[int, Any]]]]:
    """What the TensorBoard file must hold, from the JSON lines of the same
    run: per tag, (window number, float32 value); per Stat with a
    distribution, (window number, distribution)."""
    points: dict[str, list[tuple[int, float]]] = {}
    histograms: dict[str, list[tuple[int, Any]]] = {}
    for data, distribution in jsonl_windows(path):
        for key, value in data.items():
            points.setdefault(key, []).append((len(points.get(key, [])) + 1, f32(value)))
        if distribution is not None:
            stat = next(iter(data)).rpartition(".")[0]
            tag = f"{stat}.histogram"
            histograms.setdefault(tag, []).append((len(histograms.get(tag, [])) + 1, distribution))
    return points, histograms


def record_run(logdir: Path, jsonl: Path) -> None:
    """Three Stats (one with P aggregations, samples with NaN and the
    infinities), a few windows each, through the native handler and the
    JSON-lines handler at once."""
    tb = TensorboardEventHandler.logdir(logdir)
    with JsonlEventHandler(jsonl, distributions=True) as lines, registered(tb), registered(lines):
        latency = Stat("step.latency", P_AGGS, timedelta(hours=1))
        loss = Stat("train.loss", [Aggregation.MEAN, Aggregation.MIN], timedelta(hours=1))
        odd = Stat("odd", [Aggregation.MAX, Aggregation.P50, Aggregation.SUM], timedelta(hours=1))
        for window in range(6):
            for i in range(50):
                latency.add(0.001 * (i + 1) * (window + 1) + (1e3 if i == 49 else 0.0))
                loss.add(1.0 / (i + window + 1))
            odd.add([math.nan, math.inf, -2.5, 0.0, 1e40, -math.inf][window])
            odd.add(-0.25 * window)
            emit_open_windows(latency, loss, odd)
        tb.flush()
    tb.close()


def test_read_back_equals_the_json_lines_of_the_same_run(tmp_path: Path) -> None:
    record_run(tmp_path / "tb", tmp_path / "run.jsonl")
    points, histograms = expected_from_jsonl(tmp_path / "run.jsonl")
    assert len(points) == 10 and sum(map(len, points.values())) == 60
    acc = accumulator(tmp_path / "tb")
    got = scalars(acc)
    assert set(got) == set(points)
    for tag, expected in points.items():
        assert len(got[tag]) == len(expected), tag
        for (step, value), (want_step, want) in zip(got[tag], expected):
            assert step == want_step and same(value, want), (tag, step, value, want)
    assert (
        set(acc.Tags()["histograms"])
        == set(histograms)
        == {
            "step.latency.histogram",
            "odd.histogram",
        }
    )
    for tag, expected in histograms.items():
        got_h = acc.Histograms(tag)
        assert [h.step for h in got_h] == [s for s, _ in expected]
        for h, (_, d) in zip(got_h, expected):
            v = h.histogram_value
            assert v.num == d.count
            # Every finite sample is in a bucket (TensorBoard's histograms
            # hold no NaN or infinity), each bucket's right edge at or above
            # its samples; min and max are the window's when finite.
            infinite = d.positive_inf_count + d.negative_inf_count
            assert sum(v.bucket) == d.count - d.nan_count - infinite
            assert list(v.bucket_limit) == sorted(v.bucket_limit)
            assert math.isfinite(v.min) and math.isfinite(v.max)
            if math.isfinite(d.min):
                assert v.min == d.min
            if math.isfinite(d.max):
                assert v.max == d.max
                last = max(i for i, c in enumerate(v.bucket) if c)
                assert v.bucket_limit[last] >= d.max
    # The P99 of the latency window: TensorBoard's float32 of the JSON value.
    p99 = [v for _, v in got["step.latency.p99"]]
    assert p99 == [
        f32(d["step.latency.p99"])
        for d, _ in jsonl_windows(tmp_path / "run.jsonl")
        if "step.latency.p99" in d
    ]


def test_file_is_named_as_tensorboard_expects_and_starts_with_file_version(
    tmp_path: Path,
) -> None:
    handler = TensorboardEventHandler.logdir(tmp_path / "new" / "dir", filename_suffix=".r0")
    handler.close()
    path = Path(handler.path or "")
    assert path.parent == tmp_path / "new" / "dir"
    parts = path.name.split(".")
    assert parts[:3] == ["events", "out", "tfevents"], path.name
    assert parts[3].isdigit() and abs(int(parts[3]) - time.time()) < 60
    assert path.name.endswith(f".{os.getpid()}.{parts[-2]}.r0")
    records = read_records(path.read_bytes())
    assert len(records) == 1
    from tensorboard.compat.proto import event_pb2

    event = event_pb2.Event.FromString(records[0])
    assert event.file_version == "brain.Event:2"
    assert repr(handler).startswith("TensorboardEventHandler.logdir(")


def read_records(data: bytes) -> list[bytes]:
    """The records of an event file, each checked against both of its CRCs
    with TensorBoard's own CRC; fails on anything after the last whole one."""
    records, at = [], 0
    while at < len(data):
        assert at + 12 <= len(data), f"a torn record header at byte {at}"
        (length,) = struct.unpack("<Q", data[at : at + 8])
        (crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        assert crc == pywrap.masked_crc32c(data[at : at + 8])
        end = at + 12 + length + 4
        assert end <= len(data), f"a torn record at byte {at}"
        body = data[at + 12 : end - 4]
        (crc,) = struct.unpack("<I", data[end - 4 : end])
        assert crc == pywrap.masked_crc32c(body)
        records.append(body)
        at = end
    return records


def test_a_directory_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(OSError) as info:
        TensorboardEventHandler.logdir(blocker / "runs")
    assert str(blocker) in str(info.value)
    assert "TensorboardEventHandler.logdir" in str(info.value)
    with pytest.raises(TypeError, match=r"TensorboardEventHandler.logdir\(path\)"):
        TensorboardEventHandler.logdir(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\(histograms\)"):
        TensorboardEventHandler.logdir(tmp_path, histograms="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(filename_suffix\)"):
        TensorboardEventHandler.logdir(tmp_path, filename_suffix="a/b")


def test_grouped_layout_and_histograms_off(tmp_path: Path) -> None:
    handler = TensorboardEventHandler.logdir(tmp_path / "g", layout="grouped")
    plain = TensorboardEventHandler.logdir(tmp_path / "p", histograms=False)
    with registered(handler), registered(plain):
        s = Stat("net.fwd", [Aggregation.MEAN, Aggregation.P90], timedelta(hours=1))
        for v in (1.0, 2.0, 4.0):
            s.add(v)
        emit_open_windows(s)
    handler.close()
    plain.close()
    grouped = accumulator(tmp_path / "g")
    assert set(grouped.Tags()["scalars"]) == {"net.fwd/mean", "net.fwd/p90"}
    assert grouped.Tags()["histograms"] == ["net.fwd/histogram"]
    assert grouped.Histograms("net.fwd/histogram")[0].histogram_value.num == 3
    assert accumulator(tmp_path / "p").Tags()["histograms"] == []


CHILD = """
import os, sys, time
from datetime import timedelta
import torchmon
from torchmon import Aggregation, JsonlEventHandler, Stat, TensorboardEventHandler
logdir, jsonl, mode = sys.argv[1], sys.argv[2], sys.argv[3]
torchmon.register_event_handler(TensorboardEventHandler.logdir(logdir))
torchmon.register_event_handler(JsonlEventHandler(jsonl))
s = Stat(f"proc{os.getpid() % 2}.x", [Aggregation.MEAN, Aggregation.COUNT, Aggregation.P50],
         timedelta(hours=1))
i = 0
while True:
    i += 1
    s.add(float(i)); s.add(i / 3)
    s._flush_window()
    if mode == "exit" and i == 200:
        break  # no flush: the exit step writes the queue out
    if i == 20:
        print("running", flush=True)
"""


def run_child(tmp_path: Path, name: str, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / name), str(tmp_path / f"{name}.jsonl"), mode],
        stdout=subprocess.PIPE,
        text=True,
    )


def assert_prefix_of_jsonl(acc: Any, jsonl: Path, at_least: int) -> None:
    """The child's windows, in order from its first, each whole: window i
    (from 1) holds the samples i and i/3. The JSON lines of the same run
    hold the same windows (the child's JSON-lines handler runs after the
    TensorBoard one, so a kill may leave either one window ahead)."""
    got = scalars(acc)
    (tag,) = {t for t in got if t.endswith(".mean")}
    values = [v for _, v in got[tag]]
    assert len(values) >= at_least
    assert values == [f32((i + i / 3) / 2) for i in range(1, len(values) + 1)]
    assert [s for s, _ in got[tag]] == list(range(1, len(values) + 1))
    lines = [d[tag] for d, _ in jsonl_windows(jsonl)]
    common = min(len(lines), len(values))
    assert [f32(v) for v in lines[:common]] == values[:common]


def test_a_process_ended_normally_writes_its_queue_at_exit(tmp_path: Path) -> None:
    child = run_child(tmp_path, "run", "exit")
    child.communicate(timeout=60)
    assert child.returncode == 0
    acc = accumulator(tmp_path / "run")
    assert_prefix_of_jsonl(acc, tmp_path / "run.jsonl", at_least=200)


def test_a_process_killed_mid_run_leaves_whole_records(tmp_path: Path) -> None:
    child = run_child(tmp_path, "run", "kill")
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "running\n"
        time.sleep(0.5)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)
    (path,) = (tmp_path / "run").iterdir()
    data = path.read_bytes()
    # Whatever the kill cut short at the end, every record before it reads.
    whole = []
    try:
        whole = read_records(data)
    except AssertionError:
        pass
    acc = accumulator(tmp_path / "run")
    assert_prefix_of_jsonl(acc, tmp_path / "run.jsonl", at_least=20)
    if whole:
        assert len(whole) >= 21


def test_two_processes_in_one_directory_both_read(tmp_path: Path) -> None:
    children = [run_child(tmp_path, "run", "exit") for _ in range(2)]
    for child in children:
        child.communicate(timeout=60)
        assert child.returncode == 0
    files = sorted((tmp_path / "run").iterdir())
    assert len(files) == 2
    pids = {f.name.split(".")[5] for f in files}
    assert pids == {str(c.pid) for c in children}
    jsonl = tmp_path / "run.jsonl"  # both appended whole lines to it
    for f in files:
        acc = accumulator(f)
        got = scalars(acc)
        (tag,) = {t for t in got if t.endswith(".mean")}
        assert [s for s, _ in got[tag]] == list(range(1, 201))
        assert len(read_records(f.read_bytes())) == 201 + 0  # file_version + 200 windows
    assert len(jsonl_windows(jsonl)) == 400
    # The whole directory, as TensorBoard loads it.
    together = scalars(accumulator(tmp_path / "run", purge=False))
    assert sum(len(v) for t, v in together.items() if t.endswith(".mean")) == 400


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_writes_into_the_parents_file(tmp_path: Path) -> None:
    handler = TensorboardEventHandler.logdir(tmp_path / "tb")
    with registered(handler):
        s = Stat("forked", [Aggregation.SUM], timedelta(hours=1))
        s.add(1.0)
        emit_open_windows(s)
        pid = os.fork()
        if pid == 0:  # the child: windows of its own, flushed, then gone
            code = 1
            try:
                for v in (10.0, 20.0, 30.0):
                    s.add(v)
                    emit_open_windows(s)
                torchmon.flush(timeout=10)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        s.add(2.0)
        emit_open_windows(s)
        handler.flush()
    handler.close()
    assert [v for _, v in scalars(accumulator(tmp_path / "tb"))["forked.sum"]] == [1.0, 2.0]
    assert len(list((tmp_path / "tb").iterdir())) == 1


FULL_DISK = """
import resource, signal, sys
from datetime import timedelta
import torchmon
from torchmon import Aggregation, Stat, TensorboardEventHandler
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
handler = TensorboardEventHandler.logdir(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
seen = []
torchmon.register_event_handler(handler)
torchmon.register_event_handler(seen.append)  # another sink
s = Stat("disk", [Aggregation.MEAN, Aggregation.MAX, Aggregation.P50], timedelta(hours=1))
for i in range(300):
    s.add(float(i)); s.add(i * 1.5)
    s._flush_window()
    handler.flush()  # one window a write: the file fills up window by window
torchmon.flush()
print(len([e for e in seen if e.name == torchmon.STAT_EVENT]))
"""


def test_a_full_disk_reports_one_line_and_tears_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FULL_DISK), str(tmp_path / "tb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "300"  # the other sink saw every window
    lines = proc.stderr.splitlines()
    (path,) = (tmp_path / "tb").iterdir()
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and "TensorboardEventHandler" in lines[0]
    records = read_records(path.read_bytes())  # whole records only
    assert 2 <= len(records) < 301
    # The windows written are whole windows, in order: a write that failed
    # dropped its batch of windows (a later, smaller one may succeed).
    got = scalars(accumulator(tmp_path / "tb"))
    written = [v for _, v in got["disk.max"]]
    assert len(written) == len(records) - 1
    expected = iter(f32(i * 1.5) for i in range(300))
    assert all(any(v == e for e in expected) for v in written), written


# Logs windows of MAX 1, 2, ... with a stderr line of its own between the
# steps, so that the writer's lines can be placed among them.
STEPS_CHILD = """
import os, shutil, sys, time
from datetime import timedelta
import torchmon
from torchmon import Aggregation, Stat, TensorboardEventHandler
logdir, how = sys.argv[1], sys.argv[2]
handler = TensorboardEventHandler.logdir(logdir)
torchmon.register_event_handler(handler)
s = Stat("loss", [Aggregation.MAX], timedelta(hours=1))
windows = 0
def log(n):
    global windows
    for _ in range(n):
        windows += 1
        s.add(float(windows)); s._flush_window()
        handler.flush()
def step(text):
    print(text, file=sys.stderr, flush=True)
"""

REMOVED = (
    STEPS_CHILD
    + """
log(3)
first = handler.path
if how == "rmtree":
    shutil.rmtree(logdir)
else:  # a log rotation: the file moved away, its name kept for TensorBoard
    os.rename(first, first + ".1")
# The writer looks at its path at most once a second (docs/sinks.md, "TensorBoard").
time.sleep(1.3)
log(3)
handler.close()
print(first); print(handler.path)
"""
)


@pytest.mark.parametrize("how", ["rmtree", "rotate"])
def test_a_removed_logdir_or_file_gets_a_new_file_and_keeps_later_windows(
    tmp_path: Path, how: str
) -> None:
    logdir = tmp_path / "tb"
    proc = subprocess.run(
        [sys.executable, "-c", REMOVED, str(logdir), how],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split()
    assert first != second and Path(second).parent == logdir
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"torchmon: TensorboardEventHandler: {first} was removed; later windows go to "
        f"the new file {second}"
    )
    # TensorBoard reads the directory: the windows after the removal, and,
    # after a rotation, the three before it in the moved file too.
    got = [(step, value) for step, value in scalars(accumulator(logdir))["loss.max"]]
    if how == "rmtree":
        assert got == [(4, 4.0), (5, 5.0), (6, 6.0)]
    else:
        assert got == [(i, float(i)) for i in range(1, 7)]
        assert len(read_records(Path(first + ".1").read_bytes())) == 4


RECOVERY = (
    STEPS_CHILD
    + """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
log(2)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(handler.path), hard))
step("full")
log(5)
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
step("room again")
log(3)
handler.close()
print(handler.path)
"""
)


def test_writing_again_after_a_full_disk_says_how_many_windows_were_lost(tmp_path: Path) -> None:
    logdir = tmp_path / "tb"
    proc = subprocess.run(
        [sys.executable, "-c", RECOVERY, str(logdir), ""],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    path = proc.stdout.strip()
    lines = proc.stderr.splitlines()
    assert len(lines) == 4, proc.stderr
    assert lines[0] == "full"
    assert lines[1].startswith(f"torchmon: TensorboardEventHandler could not write to {path}: ")
    assert lines[2] == "room again"
    assert lines[3] == (
        f"torchmon: TensorboardEventHandler: writing to {path} again; 5 windows were lost meanwhile"
    )
    # The five are the ones TensorBoard does not find.
    got = scalars(accumulator(logdir))["loss.max"]
    assert got == [(1, 1.0), (2, 2.0), (8, 8.0), (9, 9.0), (10, 10.0)]


PLANTED = """
import errno, os, socket, sys, time
from torchmon import TensorboardEventHandler
logdir, victim = sys.argv[1], sys.argv[2]
# The names this process's first event file can get in the next seconds,
# each a symbolic link to the victim, as another user of the directory could plant.
now = int(time.time())
for secs in range(now - 1, now + 10):
    name = f"events.out.tfevents.{secs:010}.{socket.gethostname()}.{os.getpid()}.0"
    os.symlink(victim, os.path.join(logdir, name))
try:
    TensorboardEventHandler.logdir(logdir)
except OSError as exc:
    print(errno.errorcode[exc.errno], exc.filename, sep="\\n")
"""


def test_an_event_file_name_planted_as_a_symlink_is_never_written_through(
    tmp_path: Path,
) -> None:
    """The event file is created with O_EXCL (and O_NOFOLLOW): a link at its
    name fails the constructor, naming the path, and its target is left as it
    was (docs/sinks.md, "Native writer")."""
    logdir = tmp_path / "shared"
    logdir.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    proc = subprocess.run(
        [sys.executable, "-c", PLANTED, str(logdir), str(victim)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    code, filename = proc.stdout.splitlines()
    assert code == "EEXIST"
    assert Path(filename).parent == logdir and Path(filename).is_symlink()
    assert victim.read_bytes() == b"precious"


def test_the_tensorboard_server_lists_the_scalars_and_histograms(tmp_path: Path) -> None:
    """A real ``tensorboard`` process (default loader settings) serves a
    native run: every window a point of each scalar tag, every distribution
    window a histogram of the window's count."""
    from tensorboard_server import Server, tensorboard_command

    record_run(tmp_path / "logs" / "native", tmp_path / "run.jsonl")
    points, histograms = expected_from_jsonl(tmp_path / "run.jsonl")
    srv = Server([*tensorboard_command(), "--logdir", str(tmp_path / "logs")], tmp_path / "tb.log")
    try:
        got = srv.wait_for({"native"}, {tag: len(p) for tag, p in points.items()})["native"]
        assert sorted(got) == sorted(points)
        for tag, expected in points.items():
            # JSON has no NaN or infinity: the server writes "NaN", "Infinity".
            served = [(step, float(value)) for _, step, value in got[tag]]
            assert len(served) == len(expected), tag
            for (step, value), (want_step, want) in zip(served, expected):
                assert step == want_step and same(value, want), (tag, step, value, want)
        tags = srv.get("data/plugin/histograms/tags").get("native", {})
        assert sorted(tags) == sorted(histograms)
        for tag, expected in histograms.items():
            served_h = srv.get("data/plugin/histograms/histograms", run="native", tag=tag)
            # [wall_time, step, [[left, right, count], ...]] per window
            assert [step for _, step, _ in served_h] == [s for s, _ in expected]
            for (_, _, buckets), (_, d) in zip(served_h, expected):
                infinite = d.positive_inf_count + d.negative_inf_count
                assert sum(c for _, _, c in buckets) == pytest.approx(
                    d.count - d.nan_count - infinite
                )
    finally:
        srv.stop()


BURST = """
import sys
from datetime import timedelta
import torchmon
from torchmon import Aggregation, Stat, TensorboardEventHandler
torchmon.register_event_handler(TensorboardEventHandler.logdir(sys.argv[1]))
s = Stat("burst", [Aggregation.COUNT, Aggregation.P50], timedelta(hours=1))
# Windows of ~600 buckets each: their histograms keep the writer thread busy
# well past the end of this script.
samples = [10.0 ** (k / 2) for k in range(-300, 300)]
for i in range(int(sys.argv[2])):
    s.add_many(samples)
    s._flush_window()
"""


def test_the_exit_writes_what_is_still_queued(tmp_path: Path) -> None:
    """The windows still queued when the script ends reach the file: the
    exit step (_lifecycle.py) waits for the writer thread, whose work on
    these windows outlasts the interpreter's own shutdown."""
    windows = 1500
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BURST), str(tmp_path / "tb"), str(windows)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    acc = accumulator(tmp_path / "tb")
    assert [e.value for e in acc.Scalars("burst.count")] == [600.0] * windows
    assert len(acc.Histograms("burst.histogram")) == windows


SIGTERMED = """
import sys, time
from datetime import timedelta
import torchmon
from torchmon import Aggregation, Stat, TensorboardEventHandler
torchmon.register_event_handler(TensorboardEventHandler.logdir(sys.argv[1]))
torchmon.flush_on_signals()
s = Stat("open", [Aggregation.SUM, Aggregation.P50], timedelta(hours=1))
for v in (1.0, 2.0, 4.0):
    s.add(v)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_sigterm_with_flush_on_signals_writes_the_open_window(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SIGTERMED), str(tmp_path / "tb")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=30)
    assert child.returncode == -signal.SIGTERM
    acc = accumulator(tmp_path / "tb")
    assert [e.value for e in acc.Scalars("open.sum")] == [7.0]
    assert acc.Histograms("open.histogram")[0].histogram_value.num == 3
