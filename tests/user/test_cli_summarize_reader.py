"""``torchmon summarize``'s native reader (crates/torchmon-core/src/summary/line.rs)
takes only the lines that Python's reader would take with the same event, and
leaves the rest to it: these lines sit on that boundary, and the table and
messages must be what ``read_jsonl`` makes of them (docs/cli.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchmon.cli import main

STAMP = "2025-01-02T03:04:05"


def stat_line(data: str, extra: str = "") -> str:
    return f'{{"name":"torch.monitor.Stat","timestamp":"{STAMP}"{extra},"data":{data}}}\n'


def summarize(tmp_path: Path, capsys: pytest.CaptureFixture[str], *lines: str) -> list[str]:
    log = tmp_path / "events.jsonl"
    log.write_text("".join(lines), encoding="utf-8")
    assert main(["summarize", str(log)]) == 0
    return [line.split() for line in capsys.readouterr().out.splitlines()]


def row(rows: list[list[str]], stat: str, agg: str) -> list[str]:
    return next(r for r in rows if r[:2] == [stat, agg])


def test_json_that_python_reads_its_own_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = summarize(
        tmp_path,
        capsys,
        # NaN and Infinity literals are floats to json.loads.
        stat_line('{"a.mean":NaN,"b.mean":Infinity}'),
        # -0 is the int 0, -0.0 the float: their last values print apart.
        stat_line('{"c.mean":-0,"d.mean":-0.0}'),
        # A duplicate key keeps its last value at its first place.
        stat_line('{"e.mean":1.0,"f.mean":5.0,"e.mean":2.0}'),
        # int64's limits, and a timestamp isoformat() does not write.
        stat_line('{"g.sum":-9223372036854775808}', ',"fold":1'),
        stat_line('{"g.sum":9223372036854775807}').replace(STAMP, "2025-01-02T03:04:05.123"),
    )
    assert row(rows, "a", "mean")[2:5] == ["1", "nan", "nan"]
    assert row(rows, "b", "mean")[2:5] == ["1", "inf", "inf"]
    assert row(rows, "c", "mean")[3] == "0"
    assert row(rows, "d", "mean")[3] == "-0"
    assert row(rows, "e", "mean")[2:4] == ["1", "2"]
    assert [r[0] for r in rows[1:4]] == ["a", "b", "c"]
    assert row(rows, "g", "sum")[2:4] == ["2", "9.22337e+18"]


def test_lines_python_refuses_stay_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text(
        stat_line('{"a.mean":1.0}')
        + stat_line('{"a.mean":9223372036854775808}')
        + stat_line('{"a.mean":1.0}').replace(STAMP, "2025-02-29T03:04:05")
        + stat_line('{"a.mean":1.0}', ',"distribution":{"count":1}'),
        encoding="utf-8",
    )
    assert main(["summarize", str(log)]) == 0
    captured = capsys.readouterr()
    assert "skipped 3 unreadable lines" in captured.err
    assert f"(the first: {log}:2: not a valid event: " in captured.err
    assert row([r.split() for r in captured.out.splitlines()], "a", "mean")[2] == "1"
    assert main(["summarize", "--strict", str(log)]) == 2
    assert "is out of the int64 range" in capsys.readouterr().err
