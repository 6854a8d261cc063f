"""A training loop that hangs, found by torchmon.Watchdog, with the dump printed.

Run:  python examples/watchdog_hang.py [--dump-dir DIR]

A simulated loop of ~20 ms steps under a Watchdog (min_timeout 2 s); step 50
calls a C function that holds the GIL for 5 s (as a stuck CUDA or C
extension call would). The watchdog's own thread finds the stall ~2 s after
the last step, writes every Python thread's stack to a file without the GIL,
and, once the call returns, logs the ``torchmon.hang`` and
``torchmon.resumed`` Events. The script prints both Events and the dump
(docs/watchdog.md). About 10 s; torch is not needed.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import tempfile
import time
from pathlib import Path

import torchmon


def load_batch() -> list[float]:
    time.sleep(0.005)
    return [random.random() for _ in range(64)]


def train_step(batch: list[float], step: int) -> float:
    if step == 50:
        stuck_in_a_c_call()
    time.sleep(0.015)
    return sum(batch) / len(batch)


def stuck_in_a_c_call() -> None:
    # libc's sleep(5) through ctypes.PyDLL keeps the GIL for the 5 s, as a
    # wedged C extension would: no Python thread runs meanwhile.
    ctypes.PyDLL(None).sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump-dir", type=Path, help="default: a new temporary directory")
    args = parser.parse_args()
    dump_dir = args.dump_dir or Path(tempfile.mkdtemp(prefix="torchmon-hangs-"))

    events: list[torchmon.Event] = []

    def keep(event: torchmon.Event) -> None:
        if event.name in ("torchmon.hang", "torchmon.resumed"):
            events.append(event)

    handle = torchmon.register_event_handler(keep)
    with torchmon.Watchdog(min_timeout=2.0, factor=5.0, warmup_beats=2, dump_dir=dump_dir) as wd:
        for step in range(60):
            with wd.section("data"):
                batch = load_batch()
            with wd.section("compute"):
                train_step(batch, step)
            wd.beat()
        time.sleep(0.3)  # the resumption is reported within 100 ms of the next step
        print(f"{wd.beats} steps; timeout now {wd.timeout:.1f} s\n")
    torchmon.unregister_event_handler(handle)

    for event in events:
        print(f"{event.name}: {dict(event.data)}")
    hang = next((e for e in events if e.name == "torchmon.hang"), None)
    if hang is None or not hang.data["dump"]:
        raise SystemExit("no hang was reported")
    dump = Path(str(hang.data["dump"]))
    print(f"\n--- {dump} ---")
    print(dump.read_text(), end="")


if __name__ == "__main__":
    main()
