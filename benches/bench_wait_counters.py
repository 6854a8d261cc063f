"""Cost of one start/stop pair of a PyTorch wait counter with torchmon's
backend (torchmon.bridge.record_wait_counters) against no backend.

Run:  python benches/bench_wait_counters.py [--rounds 3] [--repeat 7] [--number 200000]
      python benches/bench_wait_counters.py --callgrind [--number 10000]

libc10 looks for a backend once per process, so each configuration runs in
a child process of its own; the children alternate for ``--rounds`` rounds.
Each child measures, in the same run, ``with counter.guard(): pass`` on a
``torch.monitor._WaitCounter`` (the pair plus pybind11's call overhead,
which is the same in both) and ``math.fabs(1.5)``, the floor of any
Python-to-native call. Figures are the minimum over ``--repeat`` runs of
``--number`` calls, then over the rounds, in nanoseconds per operation.

``--callgrind`` (needs valgrind; ~10 minutes per child, most of it torch's
import) counts instead the instructions libc10 executes inside
``WaitCounterHandle::start()`` and ``stop()`` (what they call included:
torch's own backends, the clock, torchmon's backend), per start/stop pair:
figures that do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any


def child(mode: str, number: int, repeat: int) -> dict[str, float]:
    if mode == "torchmon":
        import torchmon.bridge

        torchmon.bridge.record_wait_counters()
    import torch

    counter = torch.monitor._WaitCounter("bench.pair")
    env: dict[str, Any] = {"counter": counter, "math": math}

    def ns(stmt: str) -> float:
        runs = timeit.Timer(stmt, globals=env).repeat(repeat=repeat, number=number)
        return min(runs) / number * 1e9

    stmt = "with counter.guard():\n    pass"
    result = {"fabs": ns("math.fabs(1.5)"), "guard": ns(stmt)}
    if mode == "torchmon":
        import torchmon

        result["recorded"] = float(torchmon._core._torch_wait_counter_names() != [])
    return result


CALLGRIND_CHILD = """
import sys
if sys.argv[1] == "torchmon":
    import torchmon.bridge
    torchmon.bridge.record_wait_counters(window_size=3600)
import torch
counter = torch.monitor._WaitCounter("bench.pair")
for _ in range(int(sys.argv[2])):
    with counter.guard():
        pass
"""


def callgrind_per_pair(mode: str, number: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                "--toggle-collect=c10::monitor::WaitCounterHandle::start()",
                "--toggle-collect=c10::monitor::WaitCounterHandle::stop*",
                sys.executable,
                "-c",
                CALLGRIND_CHILD,
                mode,
                str(number),
            ],
            check=True,
            capture_output=True,
            timeout=3600,
        )
        summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
        if summary is None:
            sys.exit(f"no summary line in {out}")
        return int(summary.group(1)) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--child", choices=["none", "torchmon"], help=argparse.SUPPRESS)
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    if args.callgrind:
        number = 10_000 if args.number == 200_000 else args.number
        none = callgrind_per_pair("none", number)
        tm = callgrind_per_pair("torchmon", number)
        print(f"instructions per start/stop pair inside libc10's start()/stop(), {number} pairs")
        print(f"  no backend:        {none:8.1f}")
        print(f"  torchmon backend:  {tm:8.1f}  (+{tm - none:.1f})")
        return
    if args.child:
        print(json.dumps(child(args.child, args.number, args.repeat)))
        return
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for mode in ("none", "torchmon"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    f"--repeat={args.repeat}",
                    f"--number={args.number}",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            ).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            if mode == "torchmon" and not figures.pop("recorded"):
                sys.exit("torchmon's backend recorded nothing: the figures would be wrong")
            kept = best.setdefault(mode, figures)
            for key, value in figures.items():
                kept[key] = min(kept[key], value)
    none, tm = best["none"], best["torchmon"]
    print(f"{'':44} {'ns/op':>8} {'x fabs':>7}")
    for label, figures in (("guard pair, no backend", none), ("guard pair, torchmon backend", tm)):
        print(f"{label:44} {figures['guard']:8.1f} {figures['guard'] / figures['fabs']:7.2f}")
        print(f"{'  math.fabs(1.5), same process':44} {figures['fabs']:8.1f} {1.0:7.2f}")
    extra = tm["guard"] - none["guard"]
    print(
        f"torchmon's backend adds {extra:.1f} ns per start/stop pair "
        f"({extra / tm['fabs']:.2f} x fabs; guard with/without: {tm['guard'] / none['guard']:.2f})"
    )


if __name__ == "__main__":
    main()
