"""``torchmon summarize FILE.jsonl...``: a per-stat table of JSON-lines logs, and
the quantiles of their stored distributions merged (docs/cli.md)."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from .._core import _AGGREGATION_KEY_SUFFIXES, STAT_EVENT, Event
from ._common import _EXIT_OK, _read_records

if TYPE_CHECKING:
    from .._distribution import Distribution

#: The quantile columns: (header, q).
_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))

_AGGREGATION_NAMES = frozenset(_AGGREGATION_KEY_SUFFIXES)


def _split_stat_key(key: str) -> tuple[str, str]:
    """``"train.loss.mean"`` -> ``("train.loss", "mean")``."""
    stat, dot, agg = key.rpartition(".")
    if dot and agg in _AGGREGATION_NAMES:
        return stat, agg
    return key, ""


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Summary:
    """Per-stat series of every aggregation across the Stat events' windows,
    the merge of their stored distributions, and a count (with the last
    data) of every other event name."""

    def __init__(self, records: Iterable[tuple[Event, Distribution | None]]) -> None:
        # stat -> aggregation -> values, in window order; dicts keep first-seen order.
        self.stats: dict[str, dict[str, list[float]]] = {}
        self.windows: dict[str, int] = {}
        self.others: dict[str, int] = {}
        self.last_other: dict[str, dict[str, Any]] = {}
        # stat -> (the merge of its windows' distributions, how many windows)
        self.distributions: dict[str, tuple[Distribution, int]] = {}
        for event, distribution in records:
            data = event.data
            if event.name == STAT_EVENT:
                if distribution is not None and data:
                    self._merge(next(iter(data)), distribution)
                seen: set[str] = set()
                for key, value in data.items():
                    if not _is_number(value):
                        continue
                    stat, agg = _split_stat_key(key)
                    self.stats.setdefault(stat, {}).setdefault(agg, []).append(float(value))
                    seen.add(stat)
                for stat in seen:
                    self.windows[stat] = self.windows.get(stat, 0) + 1
            else:
                self.others[event.name] = self.others.get(event.name, 0) + 1
                self.last_other[event.name] = data

    def _merge(self, key: str, distribution: Distribution) -> None:
        # Every key of a Stat window event is "<stat>.<aggregation>".
        stat = key.rpartition(".")[0] or key
        merged = self.distributions.get(stat)
        if merged is None:
            self.distributions[stat] = (distribution, 1)
        else:
            self.distributions[stat] = (merged[0].merge(distribution), merged[1] + 1)

    def quantile_rows(self) -> list[list[str]]:
        rows = [["stat", "windows", "samples", *(name for name, _ in _QUANTILES)]]
        for stat in sorted(self.distributions):
            merged, windows = self.distributions[stat]
            rows.append(
                [
                    stat,
                    str(windows),
                    str(merged.count),
                    *(_number(merged.quantile(q)) for _, q in _QUANTILES),
                ]
            )
        return rows

    def stat_rows(self) -> list[list[str]]:
        rows = [["stat", "aggregation", "windows", "last", "mean", "min", "max"]]
        for stat in sorted(self.stats):
            for agg, values in self.stats[stat].items():
                numbers = [v for v in values if not math.isnan(v)]
                rows.append(
                    [
                        stat,
                        agg or "-",
                        str(self.windows[stat]),
                        _number(values[-1]),
                        _number(_mean(numbers)) if numbers else "nan",
                        _number(min(numbers)) if numbers else "nan",
                        _number(max(numbers)) if numbers else "nan",
                    ]
                )
        return rows

    def other_rows(self) -> list[list[str]]:
        rows = [["event", "count", "last data"]]
        for name in sorted(self.others):
            data = self.last_other[name]
            shown = " ".join(f"{k}={_value_text(v)}" for k, v in data.items())
            rows.append([name, str(self.others[name]), shown])
        return rows

    def write(self, out: TextIO) -> None:
        if self.stats:
            _write_table(self.stat_rows(), out, numeric_from=2)
        else:
            print("no Stat events", file=out)
        if self.distributions:
            print(file=out)
            _write_table(self.quantile_rows(), out, numeric_from=1)
        if self.others:
            print(file=out)
            _write_table(self.other_rows(), out, numeric_from=1, numeric_to=2)


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


#: The aggregations whose values add up across windows and ranks.
_ADDITIVE = frozenset({"count", "sum"})


class _Ranks:
    """Across files (ranks): for every stat and aggregation, the total of the
    additive ones, and the min and max over every window of every file with
    the file (rank) that held it: the straggler view."""

    def __init__(self, files: list[tuple[str, list[tuple[Event, Distribution | None]]]]) -> None:
        # (stat, aggregation) -> [files holding it, total, min, min label, max, max label]
        self.rows: dict[tuple[str, str], list[Any]] = {}
        for label, records in files:
            seen: set[tuple[str, str]] = set()
            for event, _ in records:
                if event.name != STAT_EVENT:
                    continue
                for key, value in event.data.items():
                    if not _is_number(value):
                        continue
                    value = float(value)
                    name = _split_stat_key(key)
                    row = self.rows.setdefault(name, [0, 0.0, math.nan, "-", math.nan, "-"])
                    if name not in seen:
                        seen.add(name)
                        row[0] += 1
                    row[1] += value
                    if math.isnan(value):
                        continue
                    # Strict comparisons: on a tie the first file given keeps it.
                    if math.isnan(row[2]) or value < row[2]:
                        row[2:4] = value, label
                    if math.isnan(row[4]) or value > row[4]:
                        row[4:6] = value, label

    def rank_rows(self) -> list[list[str]]:
        rows = [["stat", "aggregation", "ranks", "total", "min", "min_rank", "max", "max_rank"]]
        for stat, agg in sorted(self.rows, key=lambda name: name[0]):
            ranks, total, low, low_at, high, high_at = self.rows[stat, agg]
            rows.append(
                [
                    stat,
                    agg or "-",
                    str(ranks),
                    _number(total) if agg in _ADDITIVE else "-",
                    _number(low),
                    low_at,
                    _number(high),
                    high_at,
                ]
            )
        return rows

    def write(self, out: TextIO) -> None:
        if self.rows:
            print(file=out)
            _write_table(self.rank_rows(), out, numeric_from=2)


def _mean(values: list[float]) -> float:
    """The mean of non-NaN ``values``, as IEEE arithmetic has it where
    ``math.fsum`` raises: inf and -inf give NaN, and a sum beyond the float
    range (two values near 1e308) is no reason for the mean to be."""
    if math.inf in values:
        return math.nan if -math.inf in values else math.inf
    if -math.inf in values:
        return -math.inf
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


def _number(value: float) -> str:
    return f"{value:.6g}"


def _value_text(value: object) -> str:
    return _number(value) if isinstance(value, float) else repr(value)


def _write_table(
    rows: list[list[str]], out: TextIO, numeric_from: int, numeric_to: int | None = None
) -> None:
    """Aligned columns: text left-aligned, numbers right-aligned; the last
    column is not padded."""
    numeric_to = len(rows[0]) if numeric_to is None else numeric_to
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
    records: list[tuple[Event, Distribution | None]] = []
    per_file = []
    skipped, first_skipped = 0, None
    for path in args.files:
        more, skipped_here, first_here = _read_records(path, "raise" if args.strict else "skip")
        records += more
        per_file.append(more)
        skipped += skipped_here
        first_skipped = first_skipped or first_here
    if skipped:
        # A torn line (a writer killed mid-line, a full disk) must not hide
        # the rest of the log; the count says what was left out.
        lines = "line" if skipped == 1 else "lines"
        print(
            f"torchmon summarize: skipped {skipped} unreadable {lines} "
            f"(the first: {first_skipped}); --strict stops at it instead",
            file=err,
        )
    if not records:
        where = args.files[0] if len(args.files) == 1 else f"{len(args.files)} files"
        print(f"{where}: no events", file=out)
        return _EXIT_OK
    _Summary(records).write(out)
    if len(args.files) > 1:
        _Ranks(list(zip(_rank_labels(args.files), per_file))).write(out)
    return _EXIT_OK


def add_parser(commands: Any) -> None:
    summarize = commands.add_parser(
        "summarize",
        help="print a per-stat table of JSON-lines logs",
        description=(
            "For every Stat in the JSON-lines logs: the number of windows and the last, "
            "mean, min and max of each aggregation across them; then, for the Stats "
            "whose distributions were stored (JsonlEventHandler(distributions=True)), "
            "p50, p90, p99 and p999 of every sample of every window of every file; "
            "then a count of the other events; with many files (events-rank*.jsonl), "
            "the totals of count and sum across them and the min and max of every "
            "aggregation with the rank (or file) that held it."
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
