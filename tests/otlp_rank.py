"""A rank process for tests/sinks/test_otlp_victoriametrics.py: no torch, only
torchmon. It pushes one Stat with P50/P99 (``"step.latency"``) with
``OpenTelemetryEventHandler.otlp(--endpoint)`` (rank labels from the
``RANK``/``LOCAL_RANK``/``GROUP_RANK``/``TORCHELASTIC_RUN_ID`` environment the
test gives it, as torchrun would), records deterministic samples (seeded by
its rank) over ``--windows`` windows, exporting after each (``torchmon.flush``),
their spread growing from window to window as a training run's latencies may,
closes the handler (its last export) and writes what it recorded to
``--truth DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from datetime import timedelta
from pathlib import Path

import torchmon


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--truth", type=Path, required=True)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--samples", type=int, default=500, help="per window")
    parser.add_argument("--scale", type=int, default=None, help="the handler's fixed scale")
    args = parser.parse_args()

    info = torchmon.rank_info()
    options = {} if args.scale is None else {"scale": args.scale}
    sink = torchmon.OpenTelemetryEventHandler.otlp(
        args.endpoint, export_interval=float("inf"), **options
    )
    handle = torchmon.register_event_handler(sink)
    rng = random.Random(2000 + info.rank)
    window = timedelta(milliseconds=100)
    stat = torchmon.Stat(
        "step.latency", [torchmon.Aggregation.P50, torchmon.Aggregation.P99], window
    )
    recorded: list[float] = []
    for i in range(args.windows):
        # Wider each window: the merged histogram needs a lower scale to
        # stay within max_buckets.
        values = [rng.lognormvariate(-2.0, 0.1 * (i + 1)) for _ in range(args.samples)]
        stat.add_many(values)
        recorded += values
        time.sleep(0.15)  # the next samples land in a new window
        torchmon.flush()  # this window's export
    torchmon.unregister_event_handler(handle)
    sink.close()
    args.truth.mkdir(parents=True, exist_ok=True)
    path = args.truth / f"rank{info.rank}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"rank": info.rank, "samples": recorded}), encoding="utf-8")
    os.replace(partial, path)


if __name__ == "__main__":
    main()
