"""A light rank process for the native-histogram tests and benchmark
(tests/user/test_torchrun_prometheus_native.py, benches/bench_prometheus_ranks.py):
no torch, only torchmon. It serves its Stats with
``PrometheusEventHandler.serve(port_base)`` (port ``port_base + LOCAL_RANK``,
rank labels from torchrun's environment), records deterministic samples
(seeded by its rank) into ``--stats`` distribution Stats over a few windows,
emits them, writes what it recorded to ``--truth DIR`` (when given) and
keeps serving until it is signalled.

Stat ``i`` is ``"latency<i>"`` (positive samples); with ``--negative`` Stat
0 is ``"reward"``, normal around -1 (mostly negative), and Stat 1
``"loss_delta"``, every sample negative.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from datetime import timedelta
from pathlib import Path

import torchmon


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-base", type=int, required=True)
    parser.add_argument("--stats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=600, help="per Stat")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--negative", action="store_true")
    parser.add_argument("--truth", type=Path)
    parser.add_argument("--classic-only", action="store_true", help="no P50/P99 gauges")
    args = parser.parse_args()

    info = torchmon.rank_info()
    sink = torchmon.PrometheusEventHandler.serve(port_base=args.port_base)
    torchmon.register_event_handler(sink)
    rng = random.Random(1000 + info.rank)
    names = [f"latency{i}" for i in range(args.stats)]
    if args.negative:
        names[:2] = ["reward", "loss_delta"]
    window = timedelta(milliseconds=200)
    aggregations = [torchmon.Aggregation.MEAN, torchmon.Aggregation.P50, torchmon.Aggregation.P99]
    stats = [torchmon.Stat(name, aggregations, window) for name in names]
    recorded: dict[str, list[float]] = {name: [] for name in names}
    per_window = max(1, args.samples // args.windows)
    for _ in range(args.windows):
        for name, stat in zip(names, stats):
            if name == "reward":
                values = [rng.gauss(-1.0, 2.0) for _ in range(per_window)]
            elif name == "loss_delta":
                values = [-rng.lognormvariate(-3.0, 1.0) for _ in range(per_window)]
            else:
                values = [rng.lognormvariate(-4.0, 0.5) for _ in range(per_window)]
            stat.add_many(values)
            recorded[name] += values
        time.sleep(0.25)  # the next samples land in a new window
    torchmon.flush()
    if args.truth is not None:
        args.truth.mkdir(parents=True, exist_ok=True)
        path = args.truth / f"rank{info.rank}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps({"rank": info.rank, "samples": recorded}), encoding="utf-8")
        os.replace(partial, path)
    print(f"rank {info.rank} (pid {os.getpid()}) serving on port {sink.port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    sink.close()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
