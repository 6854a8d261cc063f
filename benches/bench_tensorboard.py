"""What a window costs the thread that closes it through the TensorBoard
sinks, and how fast ``torchmon to-tensorboard`` converts a log.

Run:  python benches/bench_tensorboard.py [--windows 2000] [--repeats 5] [--log-mb 5]

1. Closing thread, CPU per window (``time.thread_time_ns`` around
   ``Stat._flush_window()``, which hands the window to every registered
   handler on the calling thread): a Stat with 5 aggregations (MEAN, MAX,
   MIN, COUNT, SUM), and one with 5 where two are P aggregations (its
   window carries a distribution), through no handler, the JSON-lines
   handler, ``TensorboardEventHandler.logdir`` (native), and
   ``TensorboardEventHandler`` over tensorboardX's and torch's
   ``SummaryWriter`` when installed. The baseline is a bare
   ``math.fabs(1.5)`` call measured the same way (per call, over a loop).
   Medians of each repeat's per-window median; the minimum of the repeats.
   "process": the whole process's CPU per window over a repeat, the sinks'
   own threads included (until the handler's ``flush()`` returned).
2. ``torchmon to-tensorboard`` on a generated JSON-lines log (about
   ``--log-mb`` MB, ~14,000 lines, ~4 scalars a line), in this process,
   against a bare ``json.loads`` loop over the same file: process CPU
   (``time.process_time``, the writer thread included), the minimum and
   median of the repeats, and their ratios; both as shipped (the Stat lines
   read in the core) and with every line through the Python reader
   (``to_tensorboard._NATIVE_READER = False``).

Figures: docs/performance.md, "TensorBoard".
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import torchmon
from torchmon import (
    Aggregation,
    Event,
    JsonlEventHandler,
    Stat,
    TensorboardEventHandler,
)
from torchmon.testing import ManualClock

PLAIN = [Aggregation.MEAN, Aggregation.MAX, Aggregation.MIN, Aggregation.COUNT, Aggregation.SUM]
WITH_P = [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT, Aggregation.P50, Aggregation.P99]


def fabs_ns(calls: int = 200_000) -> float:
    """CPU ns of one ``math.fabs(1.5)`` call, loop overhead included."""
    fabs = math.fabs
    start = time.thread_time_ns()
    for _ in range(calls):
        fabs(1.5)
    return (time.thread_time_ns() - start) / calls


def per_window_ns(
    aggregations: list[Aggregation], windows: int, handler: Any = None
) -> tuple[float, float]:
    """The median CPU ns the closing thread spends in one window's flush,
    and the process's CPU ns per window over the whole loop (the sink's
    own threads included, until its ``flush()`` returned)."""
    stat = Stat("bench.step_latency_ms", aggregations, timedelta(hours=1))
    costs = []
    clock = time.thread_time_ns
    process_start = time.process_time_ns()
    for i in range(windows):
        stat.add(1.0 + i % 7)
        stat.add(2.5)
        start = clock()
        stat._flush_window()
        costs.append(clock() - start)
    if handler is not None and hasattr(handler, "flush"):
        handler.flush()
    return statistics.median(costs), (time.process_time_ns() - process_start) / windows


@contextlib.contextmanager
def registered(handler: Any) -> Iterator[None]:
    handle = torchmon.register_event_handler(handler) if handler is not None else None
    try:
        yield
    finally:
        if handle is not None:
            torchmon.unregister_event_handler(handle)


def sinks(tmp: Path) -> dict[str, Callable[[], Any]]:
    made: dict[str, Callable[[], Any]] = {
        "no handler": lambda: None,
        "JsonlEventHandler": lambda: JsonlEventHandler(tmp / "bench.jsonl"),
        "TensorboardEventHandler.logdir (native)": lambda: TensorboardEventHandler.logdir(
            tmp / "native"
        ),
    }
    try:
        import tensorboardX

        made["TensorboardEventHandler(tensorboardX.SummaryWriter)"] = lambda: (
            TensorboardEventHandler(tensorboardX.SummaryWriter(str(tmp / "tbx")))
        )
    except ImportError:
        pass
    try:
        from torch.utils.tensorboard import SummaryWriter

        made["TensorboardEventHandler(torch SummaryWriter)"] = lambda: TensorboardEventHandler(
            SummaryWriter(str(tmp / "torch"))
        )
    except ImportError:
        pass
    return made


def close(handler: Any) -> None:
    if handler is None:
        return
    if isinstance(handler, TensorboardEventHandler) and handler.path is None:
        handler.flush()
        handler._writer.close()  # the SummaryWriter, which the bench made
    else:
        handler.close()


def bench_closing_thread(windows: int, repeats: int) -> None:
    print(f"1. closing thread, CPU per window ({windows} windows x {repeats} repeats)")
    baseline = [fabs_ns() for _ in range(repeats)]
    print(f"   math.fabs(1.5) call: median {statistics.median(baseline):.0f} ns")
    with tempfile.TemporaryDirectory() as tmp:
        for label, aggregations in (("5 aggregations", PLAIN), ("with P50/P99", WITH_P)):
            print(f"   {label}:")
            for name, make in sinks(Path(tmp)).items():
                handler = make()
                results, process = [], []
                with registered(handler):
                    per_window_ns(aggregations, windows // 10)  # warm-up
                    for _ in range(repeats):
                        thread_ns, process_ns = per_window_ns(aggregations, windows, handler)
                        results.append(thread_ns)
                        process.append(process_ns)
                        gc.collect()
                close(handler)
                median = statistics.median(results)
                print(
                    f"     {name:55s} median {median / 1000:6.1f} us"
                    f"  min {min(results) / 1000:6.1f} us"
                    f"  = {median / statistics.median(baseline):5.0f} x fabs"
                    f"  | process {statistics.median(process) / 1000:6.1f} us"
                )


def make_log(path: Path, megabytes: float) -> tuple[int, int]:
    """A log like a training run's: 4 Stats of 4 aggregations a window,
    an epoch event every 10 windows; lines and bytes."""
    handler = JsonlEventHandler(path)
    windows = int(3400 * megabytes / 5)
    with registered(handler), ManualClock(0) as clock:
        stats = [
            Stat(
                f"model.encoder.layer{i}.attention.forward_latency_ms",
                [Aggregation.MEAN, Aggregation.MAX, Aggregation.MIN, Aggregation.COUNT],
                timedelta(seconds=1),
            )
            for i in range(4)
        ]
        for w in range(windows):
            for j, stat in enumerate(stats):
                stat.add(w * 0.37 + j)
                stat.add(w / 7.0)
            clock.advance(1000)
            if w % 10 == 0:
                torchmon.log_event(
                    Event(
                        "train.epoch_end",
                        datetime.now(),
                        {"epoch": w // 10, "loss": 1.0 / (w + 1), "accuracy": 0.5},
                    )
                )
        for stat in stats:
            stat._flush_window()
    handler.close()
    data = path.read_bytes()
    return data.count(b"\n"), len(data)


def bench_to_tensorboard(megabytes: float, repeats: int) -> None:
    from torchmon.cli import main, to_tensorboard

    def convert(log: Path, out: Path, *, native: bool) -> None:
        shutil.rmtree(out, ignore_errors=True)
        to_tensorboard._NATIVE_READER = native
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["to-tensorboard", str(log), str(out)]) == 0
        finally:
            to_tensorboard._NATIVE_READER = True

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        lines, size = make_log(log, megabytes)
        print(f"2. to-tensorboard on {size / 1e6:.1f} MB, {lines} lines (CPU s, process)")
        times: dict[str, list[float]] = {
            "json.loads loop": [],
            "to-tensorboard, Python reader": [],
            "to-tensorboard": [],
        }
        for _ in range(repeats):
            start = time.process_time()
            with log.open("rb") as f:
                for line in f:
                    json.loads(line)
            times["json.loads loop"].append(time.process_time() - start)
            # The reader of every line before the core's (the reference the
            # tests compare with), then the command as shipped.
            for name, native in (
                ("to-tensorboard, Python reader", False),
                ("to-tensorboard", True),
            ):
                start = time.process_time()
                convert(log, Path(tmp) / "out", native=native)
                times[name].append(time.process_time() - start)
        loads = times["json.loads loop"]
        for name, spent in times.items():
            ratio = statistics.median(spent) / statistics.median(loads)
            print(
                f"   {name:30s} min {min(spent):.3f}  median {statistics.median(spent):.3f}"
                f"  (median/median {ratio:.2f}x, min/min {min(spent) / min(loads):.2f}x)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--log-mb", type=float, default=5.0)
    parser.add_argument("--skip-windows", action="store_true")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, torchmon {torchmon.__version__}")
    if not args.skip_windows:
        bench_closing_thread(args.windows, args.repeats)
    bench_to_tensorboard(args.log_mb, args.repeats)


if __name__ == "__main__":
    main()
