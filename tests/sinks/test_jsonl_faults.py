"""JSON lines under faults (docs/sinks.md, "Faults"): what read_jsonl makes
of unreadable and unfinished lines, and what JsonlEventHandler leaves in the
file when a write fails or a writer was killed mid-line."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from torchmon import Event, JsonlEventHandler, read_jsonl

GOOD = b'{"name":"ok","timestamp":"2020-01-01T00:00:00","data":{}}'


def numbered_line(i: int) -> bytes:
    return b'{"name":"n","timestamp":"2020-01-01T00:00:00","data":{"i":%d}}' % i


# --- reading ------------------------------------------------------------------


@pytest.mark.parametrize("errors", ["raise", "skip"])
@pytest.mark.parametrize(
    "fragment",
    [
        GOOD[:1],
        GOOD[:-1],  # all but the closing brace
        '{"name":"\u00e9'.encode(),
        '{"name":"\u00e9'.encode()[:-1],  # cut inside a character: not UTF-8 (yet)
    ],
)
def test_an_unfinished_last_line_is_not_yet_written(
    tmp_path: Path, errors: str, fragment: bytes
) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(GOOD + b"\n" + GOOD + b"\n" + fragment)
    reader = read_jsonl(path, errors=errors)
    assert [e.name for e in reader] == ["ok", "ok"]
    assert (reader.skipped, reader.first_skipped) == (0, None)


def test_a_whole_last_line_without_its_newline_is_read(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(GOOD + b"\n" + numbered_line(7))
    assert [e.data for e in read_jsonl(path)] == [{}, {"i": 7}]


def test_errors_skip_skips_unreadable_lines_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(
        b"\n".join(
            [
                numbered_line(0),
                numbered_line(1)[:20],  # a torn line, followed by more lines
                numbered_line(2),
                b'{"name":"\xff"}',  # not UTF-8
                b"[" * 100_000,  # nested beyond json's recursion limit
                numbered_line(3),
                b"",
            ]
        )
    )
    reader = read_jsonl(path, errors="skip")
    assert [e.data["i"] for e in reader] == [0, 2, 3]
    assert reader.skipped == 3
    assert reader.first_skipped is not None
    assert reader.first_skipped.startswith(f"{path}:2: not valid JSON"), reader.first_skipped
    # The default stops at the first one, naming it.
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not valid JSON"):
        list(read_jsonl(path))


def test_errors_argument_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"read_jsonl\(errors\): errors must be 'raise' or 'skip'"):
        read_jsonl(tmp_path / "e.jsonl", errors="ignore")
    not_a_str = r"read_jsonl\(errors\): errors must be a str, not NoneType"
    with pytest.raises(TypeError, match=not_a_str):
        read_jsonl(tmp_path / "e.jsonl", errors=None)  # type: ignore[arg-type]


def test_reader_close_and_repr(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(GOOD + b"\n" + GOOD + b"\n")
    reader = read_jsonl(path, errors="skip")
    assert iter(reader) is reader
    assert next(reader).name == "ok"
    reader.close()
    assert list(reader) == []
    assert repr(reader) == f"JsonlReader({str(path)!r}, errors='skip', skipped=0)"


WRITER = textwrap.dedent(
    """
    import os, sys, time
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
    for i in range(int(sys.argv[2])):
        line = b'{"name":"n","timestamp":"2020-01-01T00:00:00","data":{"i":%d}}\\n' % i
        for k in range(0, len(line), 7):  # a line in pieces, as a slow writer might
            os.write(fd, line[k : k + 7])
            time.sleep(0.0005)
    """
)


def test_a_reader_tailing_a_growing_file_sees_whole_events_only(tmp_path: Path) -> None:
    """Read while another process writes lines in pieces: every read succeeds
    and gives a prefix of the events (docs/sinks.md, "Reading")."""
    path = tmp_path / "e.jsonl"
    path.touch()
    total = 150
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(total)])
    try:
        reads = 0
        while writer.poll() is None or reads == 0:
            got = [e.data["i"] for e in read_jsonl(path)]
            assert got == list(range(len(got)))
            reads += 1
        assert writer.wait(timeout=120) == 0
    finally:
        writer.kill()
        writer.wait()
    assert [e.data["i"] for e in read_jsonl(path)] == list(range(total))
    assert reads > 1


# --- writing ------------------------------------------------------------------

# Logs 600 events of varying length through a JsonlEventHandler while the file
# cannot grow (a full disk) from some point on, until event 400, when room is
# made again; prints which events log_event returned from without error.
FULL_DISK_CHILD = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    from datetime import datetime
    import torchmon

    path, limit, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "fsize":
        # Writing past RLIMIT_FSIZE fails with EFBIG once SIGXFSZ is ignored;
        # a write that straddles the limit is cut short first, as on ENOSPC.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    else:  # "tmpfs": the file system really is full; a filler file makes room
        filler = os.path.join(os.path.dirname(path), "filler")
    sink = torchmon.JsonlEventHandler(path)
    torchmon.register_event_handler(sink)
    ok, errnos = [], set()
    for i in range(600):
        if i == 400:
            if mode == "fsize":
                resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
            else:
                os.remove(filler)
        event = torchmon.Event("n", datetime(2020, 1, 1), {"i": i, "pad": "x" * (i * 7 % 61)})
        try:
            torchmon.log_event(event)
        except OSError as exc:
            errnos.add(exc.errno)
        else:
            ok.append(i)
    sink.close()
    print(json.dumps({"ok": ok, "errnos": sorted(errnos)}))
    """
)


def full_disk_run(path: Path, limit: int, mode: str) -> tuple[list[int], list[int]]:
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(path), str(limit), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    return result["ok"], result["errnos"]


def assert_every_logged_event_is_read_back(path: Path, ok: list[int]) -> None:
    assert 0 < len(ok) < 600  # some events failed, some did not
    assert ok[-1] == 599  # writing went on once there was room again
    assert path.read_bytes().endswith(b"\n")
    # errors="raise": not one unreadable line.
    assert [e.data["i"] for e in read_jsonl(path)] == ok


def test_events_logged_across_a_file_size_limit_are_all_read_back(tmp_path: Path) -> None:
    """A write cut short (then EFBIG) leaves no part of a line behind
    (docs/sinks.md, "Faults")."""
    path = tmp_path / "e.jsonl"
    ok, errnos = full_disk_run(path, 16 * 1024 + 37, "fsize")
    assert errnos == [errno.EFBIG]
    assert_every_logged_event_is_read_back(path, ok)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs the right to mount: root, or CAP_SYS_ADMIN)."""
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "tmpfs"
    where.mkdir()
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=60)


def test_events_logged_across_a_full_disk_are_all_read_back(small_tmpfs: Path) -> None:
    """ENOSPC on a real full file system, then room made: every event that
    log_event returned from without error is in the file, nothing else."""
    (small_tmpfs / "filler").write_bytes(b"\0" * 24 * 1024)
    path = small_tmpfs / "e.jsonl"
    ok, errnos = full_disk_run(path, 0, "tmpfs")
    assert errnos == [errno.ENOSPC]
    assert_every_logged_event_is_read_back(path, ok)


def stamp() -> datetime:
    return datetime(2020, 1, 1)


def test_a_writer_starts_a_new_line_after_a_torn_one(tmp_path: Path) -> None:
    """A file whose writer was killed in the middle of a line (SIGKILL,
    power loss): the next handler begins a new line, so every event after
    the torn line is read."""
    path = tmp_path / "e.jsonl"
    with JsonlEventHandler(path) as sink:
        for i in range(3):
            sink(Event("n", stamp(), {"i": i}))
    whole = path.read_bytes()
    os.truncate(path, len(whole) - 9)  # the last line loses its end
    with JsonlEventHandler(path) as sink:
        for i in range(3, 6):
            sink(Event("n", stamp(), {"i": i}))
    reader = read_jsonl(path, errors="skip")
    assert [e.data["i"] for e in reader] == [0, 1, 3, 4, 5]
    assert reader.skipped == 1
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: not valid JSON"):
        list(read_jsonl(path))


def test_a_writer_starts_a_new_line_after_a_whole_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(numbered_line(0))  # e.g. written by another tool
    with JsonlEventHandler(path) as sink:
        sink(Event("n", stamp(), {"i": 1}))
    assert [e.data["i"] for e in read_jsonl(path)] == [0, 1]


class _FailingFile:
    """Writes the first half of the next write, then fails the rest, as a
    disk filling up does; truncating fails too (an I/O error)."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.fail = False

    def write(self, data: memoryview) -> int:
        if self.fail:
            self.fail = False
            self._failing = True
            return int(self._file.write(data[: len(data) // 2]))
        if getattr(self, "_failing", False):
            self._failing = False
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(self._file.write(data))

    def truncate(self, size: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def test_when_a_torn_line_cannot_be_taken_back_the_next_line_starts_anew(
    tmp_path: Path,
) -> None:
    path = tmp_path / "e.jsonl"
    with JsonlEventHandler(path) as sink:
        sink(Event("n", stamp(), {"i": 0}))
        failing = _FailingFile(sink._file)
        sink._file = failing  # type: ignore[assignment]
        failing.fail = True
        with pytest.raises(OSError, match="No space left"):
            sink(Event("n", stamp(), {"i": 1}))
        sink(Event("n", stamp(), {"i": 2}))
        sink._file = failing._file
    reader = read_jsonl(path, errors="skip")
    assert [e.data["i"] for e in reader] == [0, 2]
    assert reader.skipped == 1


def test_a_rotation_whose_directory_vanished_names_the_cause_and_recovers(
    tmp_path: Path,
) -> None:
    """The handler is not closed: each event tries to reopen the path, raising
    the OSError that stops it, and writing again once it can (docs/sinks.md,
    "Rotation")."""
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "e.jsonl"
    sink = JsonlEventHandler(path, max_bytes=150, backup_count=2)
    sink(Event("n", stamp(), {"i": 0}))
    shutil.rmtree(folder)
    for i in (1, 2):  # each rotates, and fails to reopen
        with pytest.raises(FileNotFoundError) as info:
            sink(Event("n", stamp(), {"i": i, "pad": "x" * 100}))
        message = str(info.value)
        assert "cannot reopen the file after rotating it" in message, message
        assert "No such file or directory" in message and str(path) in message, message
        assert not sink.closed
        assert "reopening after a rotation failed" in repr(sink)
    folder.mkdir()
    sink(Event("n", stamp(), {"i": 3}))
    sink(Event("n", stamp(), {"i": 4}))
    sink.close()
    assert sink.closed
    assert [e.data["i"] for e in read_jsonl(path)] == [3, 4]
    with pytest.raises(ValueError, match="is closed"):
        sink(Event("n", stamp(), {"i": 5}))
