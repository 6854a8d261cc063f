"""JSON lines under faults (docs/sinks.md, "Faults"): what read_jsonl makes
of unreadable and unfinished lines, and what JsonlEventHandler leaves in the
file when a write fails or a writer was killed mid-line."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchmon import read_jsonl

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
    with pytest.raises(ValueError, match=r"read_jsonl\(errors\): must be 'raise' or 'skip'"):
        read_jsonl(tmp_path / "e.jsonl", errors="ignore")
    with pytest.raises(TypeError, match=r"read_jsonl\(errors\): must be a str, not NoneType"):
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
