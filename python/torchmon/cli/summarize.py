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
from ._common import _EXIT_OK, _Log, _printable

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


#: The most points a trend is drawn with: a sparkline of at most this many
#: characters, each the mean of a run of consecutive windows.
_TREND_WIDTH = 24
#: Low to high; a run of only NaN windows is a space.
_TREND_BARS = "▁▂▃▄▅▆▇█"
_TREND_BARS_ASCII = "_.-=+*#@"


class _Trend:
    """A series of any length kept as at most ``_TREND_WIDTH`` runs of
    consecutive values (the sum and count of their finite ones): when the
    runs are full, neighbours are merged in pairs and each run from then on
    holds twice as many values. Memory stays the same however many windows
    a log holds. The series (:class:`_Series`) opens a run when ``capacity``
    values have come, and adds each finite value to the last run."""

    __slots__ = ("capacity", "counts", "run", "sums")

    def __init__(self) -> None:
        self.sums: list[float] = []
        self.counts: list[int] = []
        self.run = 1  # values per run; only the last run may be partly filled
        self.capacity = 0  # values the runs so far hold

    def open_run(self) -> None:
        if len(self.sums) == _TREND_WIDTH:
            self.sums = [a + b for a, b in zip(self.sums[::2], self.sums[1::2])]
            self.counts = [a + b for a, b in zip(self.counts[::2], self.counts[1::2])]
            self.run *= 2
        self.sums.append(0.0)
        self.counts.append(0)
        self.capacity = len(self.sums) * self.run

    def draw(self, bars: str) -> str:
        means = [total / n if n else math.nan for total, n in zip(self.sums, self.counts)]
        finite = [m for m in means if math.isfinite(m)]
        if not finite:
            return ""
        low, high = min(finite), max(finite)
        top = len(bars) - 1
        chars = []
        for mean in means:
            if not math.isfinite(mean):
                chars.append(" ")
            elif high == low:
                chars.append(bars[top // 2])
            else:
                # high - low may overflow to inf for values near the float limits.
                fraction = (
                    (mean - low) / (high - low)
                    if math.isfinite(high - low)
                    else (mean / 2 - low / 2) / (high / 2 - low / 2)
                )
                chars.append(bars[min(top, int(fraction * len(bars)))])
        return "".join(chars).rstrip()


class _Series:
    """One aggregation of one Stat across its windows, in constant memory:
    the last value, the exact mean, min and max of the non-NaN ones, and the
    trend."""

    __slots__ = ("_partials", "_scale", "high", "last", "low", "n", "neg_inf", "pos_inf",
                 "seen", "trend")  # fmt: skip

    def __init__(self) -> None:
        self.seen = 0
        self.n = 0  # non-NaN values
        self.last = math.nan
        self.low = math.inf
        self.high = -math.inf
        self.pos_inf = self.neg_inf = False
        # The finite values' exact sum, as math.fsum keeps it (Shewchuk's
        # non-overlapping partials, a few floats at most), scaled down by
        # 2**-_scale once a value is so large that sums could overflow.
        self._partials: list[float] = []
        self._scale = 0
        self.trend = _Trend()

    def add(self, value: float) -> None:
        self.seen += 1
        self.last = value
        trend = self.trend
        if self.seen > trend.capacity:
            trend.open_run()
        if value - value == 0.0:  # finite
            trend.sums[-1] += value
            trend.counts[-1] += 1
            self.n += 1
            if value < self.low:
                self.low = value
            if value > self.high:
                self.high = value
            self._add_finite(value)
        elif value == value:  # +-inf (NaN is not equal to itself)
            self.n += 1
            if value > 0:
                self.pos_inf = True
                self.high = value
            else:
                self.neg_inf = True
                self.low = value

    def _add_finite(self, x: float) -> None:
        if not self._scale and abs(x) > 2.0**1000:
            # From here on the sum is kept as a multiple of 2**64: no sum of
            # fewer than 2**23 doubles overflows, and values this large make
            # the bits lost below 2**-958 irrelevant to the mean.
            self._scale = 64
            self._partials = [math.ldexp(p, -64) for p in self._partials]
        if self._scale:
            x = math.ldexp(x, -self._scale)
        partials = self._partials
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                partials[i] = lo
                i += 1
            x = hi
        partials[i:] = [x]

    def mean(self) -> float:
        """The mean of the non-NaN values, as IEEE arithmetic has it where
        ``math.fsum`` raises: inf and -inf give NaN, and a sum beyond the
        float range (two values near 1e308) is no reason for the mean to be."""
        if not self.n:
            return math.nan
        if self.pos_inf:
            return math.nan if self.neg_inf else math.inf
        if self.neg_inf:
            return -math.inf
        try:
            return math.ldexp(math.fsum(self._partials) / self.n, self._scale)
        except OverflowError:
            return math.ldexp(math.fsum(p / self.n for p in self._partials), self._scale)


class _Summary:
    """Per-stat series of every aggregation across the Stat events' windows,
    the merge of their stored distributions, and a count (with the last
    data) of every other event name; fed one record at a time, in memory
    that grows with the number of Stats and event names, not of lines."""

    def __init__(self, records: Iterable[tuple[Event, Distribution | None]] = ()) -> None:
        # stat -> aggregation -> series; dicts keep first-seen order.
        self.stats: dict[str, dict[str, _Series]] = {}
        self.windows: dict[str, int] = {}
        self.others: dict[str, int] = {}
        self.last_other: dict[str, dict[str, Any]] = {}
        # stat -> (the merge of its windows' distributions, how many windows)
        self.distributions: dict[str, tuple[Distribution, int]] = {}
        for event, distribution in records:
            self.add(event, distribution)

    def add(self, event: Event, distribution: Distribution | None) -> None:
        data = event.data
        if event.name == STAT_EVENT:
            if distribution is not None and data:
                self._merge(next(iter(data)), distribution)
            seen: set[str] = set()
            for key, value in data.items():
                if not _is_number(value):
                    continue
                stat, agg = _split_stat_key(key)
                series = self.stats.setdefault(stat, {}).get(agg)
                if series is None:
                    series = self.stats[stat][agg] = _Series()
                series.add(float(value))
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

    def stat_rows(self, bars: str = _TREND_BARS) -> list[list[str]]:
        rows = [["stat", "aggregation", "windows", "last", "mean", "min", "max", "trend"]]
        for stat in sorted(self.stats):
            for agg, series in self.stats[stat].items():
                shown = _readable_bytes if _holds_bytes(stat) and agg != "count" else _number
                rows.append(
                    [
                        stat,
                        agg or "-",
                        str(self.windows[stat]),
                        shown(series.last),
                        shown(series.mean()),
                        shown(series.low) if series.n else "nan",
                        shown(series.high) if series.n else "nan",
                        series.trend.draw(bars),
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
            _write_table(self.stat_rows(_bars_for(out)), out, numeric_from=2, numeric_to=7)
        else:
            print("no Stat events", file=out)
        if self.distributions:
            print(file=out)
            _write_table(self.quantile_rows(), out, numeric_from=1)
        if self.others:
            print(file=out)
            _write_table(self.other_rows(), out, numeric_from=1, numeric_to=2)


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


#: The aggregations whose values add up across windows and ranks.
_ADDITIVE = frozenset({"count", "sum"})


class _Ranks:
    """Across files (ranks): for every stat and aggregation, the total of the
    additive ones, and the min and max over every window of every file with
    the file (rank) that held it; and for every Stat with a median, each
    rank's straggler score. Fed file by file, one record at a time."""

    def __init__(self) -> None:
        # (stat, aggregation) -> [files holding it, total, min, min label, max, max label]
        self.rows: dict[tuple[str, str], list[Any]] = {}
        # stat -> label -> (the merge of the rank's stored distributions, its p50 windows)
        self.medians: dict[str, dict[str, list[Any]]] = {}
        self._label = ""
        self._seen: set[tuple[str, str]] = set()

    def start_file(self, label: str) -> None:
        self._label = label
        self._seen = set()

    def add(self, event: Event, distribution: Distribution | None) -> None:
        if event.name != STAT_EVENT:
            return
        label = self._label
        data = event.data
        if distribution is not None and data:
            key = next(iter(data))
            median = self._median(key.rpartition(".")[0] or key, label)
            median[0] = distribution if median[0] is None else median[0].merge(distribution)
        for key, value in data.items():
            if not _is_number(value):
                continue
            value = float(value)
            name = _split_stat_key(key)
            row = self.rows.setdefault(name, [0, 0.0, math.nan, "-", math.nan, "-"])
            if name not in self._seen:
                self._seen.add(name)
                row[0] += 1
            row[1] += value
            if name[1] == "p50":
                self._median(name[0], label)[1].add(value)
            if math.isnan(value):
                continue
            # Strict comparisons: on a tie the first file given keeps it.
            if math.isnan(row[2]) or value < row[2]:
                row[2:4] = value, label
            if math.isnan(row[4]) or value > row[4]:
                row[4:6] = value, label

    def _median(self, stat: str, label: str) -> list[Any]:
        ranks = self.medians.setdefault(stat, {})
        median = ranks.get(label)
        if median is None:
            median = ranks[label] = [None, _Series()]
        return median

    def straggler_rows(self) -> list[list[str]]:
        """Per Stat and rank: the rank's p50 (of all its samples when their
        distributions were stored, else the mean of its windows' p50) and
        its score, the fastest rank's p50 over that p50 (1.0 for the fastest,
        lower for slower ranks): the straggler score of docs/cli.md, in the
        direction of docs/straggler-rules.yml's relative score."""
        rows = [["stat", "rank", "p50", "score"]]
        for stat in sorted(self.medians):
            p50s = {}
            for label, (merged, windows) in self.medians[stat].items():
                p50s[label] = merged.quantile(0.5) if merged is not None else windows.mean()
            known = [v for v in p50s.values() if math.isfinite(v)]
            if len(p50s) < 2 or not known:
                continue
            fastest = min(known)
            for label, p50 in p50s.items():
                usable = math.isfinite(p50) and fastest > 0
                score = f"{fastest / p50:.3f}" if usable else "-"
                rows.append([stat, label, _number(p50), score])
        return rows

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
        stragglers = self.straggler_rows()
        if len(stragglers) > 1:
            print(file=out)
            _write_table(stragglers, out, numeric_from=1)


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
    summary = _Summary()
    ranks = _Ranks() if len(args.files) > 1 else None
    labels = _rank_labels(args.files)
    skipped, first_skipped, records = 0, None, 0
    for path, label in zip(args.files, labels):
        log = _Log(path, "raise" if args.strict else "skip", distributions=True)
        if ranks is not None:
            ranks.start_file(label)
        for event, distribution in log:
            summary.add(event, distribution)
            if ranks is not None:
                ranks.add(event, distribution)
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
    summary.write(out)
    if ranks is not None:
        ranks.write(out)
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
            "straggler score: the fastest rank's p50 over its own. The files are read "
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
