"""``torchmon summarize FILE.jsonl...``: a per-stat table of JSON-lines logs, and
the quantiles of their stored distributions merged (docs/cli.md). The core
reads and folds the lines (crates/torchmon-core/src/summary/, through
``_core._Summary``); this module formats its rows."""

from __future__ import annotations

import argparse
import math
import os
import re
from typing import TYPE_CHECKING, Any, TextIO

from ._common import _EXIT_OK, _Log, _new_summary, _printable

if TYPE_CHECKING:
    from .._core import _Summary

#: The quantile columns' headers (p50, p90, p99 and p999: docs/cli.md).
_QUANTILES = ("p50", "p90", "p99", "p999")
#: The trend's bars, low to high; a run of only NaN windows is a space.
_TREND_BARS = "▁▂▃▄▅▆▇█"
_TREND_BARS_ASCII = "_.-=+*#@"


def write_summary(summary: _Summary, out: TextIO, *, quantiles: bool = True) -> None:
    """The tables of what ``summary`` read: per Stat and aggregation; the
    merged distributions' quantiles (unless not ``quantiles``); the other
    events; across files, per rank, and the straggler scores."""
    if stats := summary.rows("stats", _bars_for(out)):
        rows = [["stat", "aggregation", "windows", "last", "mean", "min", "max", "trend"]]
        for stat, agg, windows, *figures, trend in stats:
            shown = _readable_bytes if _holds_bytes(stat) and agg != "count" else _number
            cells = [shown(v) if v is not None else "nan" for v in figures]
            rows.append([stat, agg or "-", str(windows), *cells, trend])
        _write_table(rows, out, numeric_from=2, numeric_to=7)
    else:
        print("no Stat events", file=out)
    if quantiles and (found := summary.rows("quantiles", "")):
        print(file=out)
        rows = [["stat", "windows", "samples", *_QUANTILES]]
        rows += [[stat, str(n), str(samples), *map(_number, qs)] for stat, n, samples, *qs in found]
        _write_table(rows, out, numeric_from=1)
    if others := summary.rows("others", ""):
        # Imported here: every command imports this module (20 ms, _common).
        from ..handlers.jsonl import _decode_line

        print(file=out)
        rows = [["event", "count", "last data"]]
        for name, count, line in others:
            data = _decode_line(line.decode("utf-8")).data
            text = " ".join(f"{k}={_value_text(v)}" for k, v in data.items())
            rows.append([name, str(count), text])
        _write_table(rows, out, numeric_from=1, numeric_to=2)
    if ranked := summary.rows("ranks", ""):
        print(file=out)
        rows = [["stat", "aggregation", "ranks", "total", "min", "min_rank", "max", "max_rank"]]
        for stat, agg, ranks, total, low, low_at, high, high_at in ranked:
            total_text = "-" if total is None else _number(total)
            rows.append([stat, agg or "-", str(ranks), total_text,
                         _number(low), low_at, _number(high), high_at])  # fmt: skip
        _write_table(rows, out, numeric_from=2)
    if stragglers := summary.rows("stragglers", ""):
        sections = [row for row in stragglers if row[0].startswith(_SECTION)]
        others = [row for row in stragglers if not row[0].startswith(_SECTION)]
        if others:
            print(file=out)
            _write_scores(["stat", "rank", "p50", "score"], others, out)
        if sections:
            # The Watchdog's sections (docs/stragglers.md): section.compute
            # is shown as compute.
            print(file=out)
            rows = [[stat[len(_SECTION) :], *rest] for stat, *rest in sections]
            _write_scores(["section", "rank", "p50", "score"], rows, out)
        print(file=out)
        print(_SECTION_NOTE if sections else _STEP_NOTE, file=out)


#: The prefix of the Watchdog's section Stats (``section.<name>``).
_SECTION = "section."
_STEP_NOTE = (
    "note: in synchronous training a whole-step score cannot see a straggler: the fast\n"
    "ranks wait for the slow one inside the step (its collectives), so every rank's step\n"
    "takes as long; time the parts of the step with torchmon.Watchdog's sections to\n"
    "score them (docs/stragglers.md)."
)
_SECTION_NOTE = (
    "note: in synchronous training a whole-step score cannot see a straggler: the fast\n"
    "ranks wait for the slow one inside the step (its collectives); the section scores\n"
    "can. A low score in a communication section is a rank that waited for the others\n"
    "(docs/stragglers.md)."
)


def _write_scores(header: list[str], found: list[Any], out: TextIO) -> None:
    rows = [header]
    for stat, rank, p50, score in found:
        rows.append([stat, rank, _number(p50), "-" if score is None else f"{score:.3f}"])
    _write_table(rows, out, numeric_from=1)


def _bars_for(out: TextIO) -> str:
    """The trend's block characters, or ASCII ones where ``out`` cannot
    encode them (a C-locale terminal, a latin-1 pipe)."""
    try:
        _TREND_BARS.encode(getattr(out, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return _TREND_BARS_ASCII
    return _TREND_BARS


#: The rank in a file's name, as ``JsonlEventHandler.for_rank`` writes it
#: (``events-rank3.jsonl``): the digits after the last "rank".
_RANK_IN_NAME = re.compile(r"rank(\d+)")


def _rank_labels(paths: list[str]) -> list[str]:
    """Each file's rank from its name (``events-rank3.jsonl`` -> ``3``); the
    paths as given when a name holds no rank or two names the same one."""
    labels = []
    for path in paths:
        found = _RANK_IN_NAME.findall(os.path.basename(path))
        labels.append(str(int(found[-1])) if found else "")
    if "" in labels or len(set(labels)) != len(labels):
        return list(paths)
    return labels


def _number(value: float) -> str:
    return f"{value:.6g}"


#: Stats in bytes by their names: SystemStats' memory figures (docs/guide.md,
#: "System stats") and, by the usual suffix, any ``..._bytes`` Stat; the disk
#: and network rates are bytes per second.
_BYTES_NAME = re.compile(
    r"(?:^|\.)memory\.(?:usage|limit|allocated|reserved)(?:\.peak)?$"
    r"|^system\.(?:disk|network)\.io\.|[._]bytes$"
)


def _holds_bytes(stat: str) -> bool:
    return _BYTES_NAME.search(stat) is not None


def _readable_bytes(value: float) -> str:
    """``35.6 MB``: decimal units, three significant digits."""
    if not math.isfinite(value):
        return _number(value)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            scaled = value / size
            return f"{scaled:.3g} {unit}" if abs(scaled) < 100 else f"{scaled:.0f} {unit}"
    return f"{value:.0f} B"


def _value_text(value: object) -> str:
    return _number(value) if isinstance(value, float) else repr(value)


def _write_table(
    rows: list[list[str]], out: TextIO, numeric_from: int, numeric_to: int | None = None
) -> None:
    """Aligned columns: text left-aligned, numbers right-aligned; the last
    column is not padded."""
    numeric_to = len(rows[0]) if numeric_to is None else numeric_to
    # Every cell may come from the input (a Stat name, an event's data).
    rows = [[_printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            last = i == len(row) - 1
            if numeric_from <= i < numeric_to:
                cells.append(cell.rjust(widths[i]))
            else:
                cells.append(cell if last else cell.ljust(widths[i]))
        print("  ".join(cells).rstrip(), file=out)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    summary = _new_summary(len(args.files) > 1)
    skipped, first_skipped, records = 0, None, 0
    for path, label in zip(args.files, _rank_labels(args.files)):
        log = _Log(path, "raise" if args.strict else "skip", distributions=True)
        log.feed(summary, label)
        records += log.records
        skipped += log.skipped
        first_skipped = first_skipped or log.first_skipped
    if skipped:
        # A torn line (a writer killed mid-line, a full disk) must not hide
        # the rest of the log; the count says what was left out.
        lines = "line" if skipped == 1 else "lines"
        print(
            _printable(
                f"torchmon summarize: skipped {skipped} unreadable {lines} "
                f"(the first: {first_skipped}); --strict stops at it instead"
            ),
            file=err,
        )
    if not records:
        where = args.files[0] if len(args.files) == 1 else f"{len(args.files)} files"
        print(_printable(f"{where}: no events"), file=out)
        return _EXIT_OK
    write_summary(summary, out)
    return _EXIT_OK


def add_parser(commands: Any) -> None:
    summarize = commands.add_parser(
        "summarize",
        help="print a per-stat table of JSON-lines logs",
        description=(
            "For every Stat in the JSON-lines logs: the number of windows and the last, "
            "mean, min and max of each aggregation across them, and its trend (a "
            "sparkline of the windows); then, for the Stats "
            "whose distributions were stored (JsonlEventHandler(distributions=True)), "
            "p50, p90, p99 and p999 of every sample of every window of every file; "
            "then a count of the other events; with many files (events-rank*.jsonl), "
            "the totals of count and sum across them and the min and max of every "
            "aggregation with the rank (or file) that held it, and each rank's "
            "straggler score: the fastest rank's p50 over its own (per section for the "
            "Watchdog's section.<name> Stats). The files are read "
            "line by line, in memory that does not grow with their length."
        ),
    )
    summarize.add_argument("files", metavar="FILE.jsonl", nargs="+")
    summarize.add_argument(
        "--strict",
        action="store_true",
        help=(
            "stop at the first unreadable line (exit code 2) instead of skipping "
            "unreadable lines and saying how many"
        ),
    )
    summarize.set_defaults(run=run)
