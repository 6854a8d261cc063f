"""A healthy training loop under torchmon.Watchdog for a while: no hang may
be reported (docs/watchdog.md, "False alarms").

The loop: a first step that compiles a model with torch.compile (seconds),
then steps of 20 ms with jitter (one in 50 takes 5x as long, as a data
loader's refill does), and a checkpoint of 3x the timeout inside
``wd.paused()`` every ``--checkpoint-every`` seconds. It prints the events
and the watchdog's timeout over the run, and exits 1 if a
``torchmon.hang`` was reported.

    .venv/bin/python benches/bench_watchdog_soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time

import torchmon


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--min-timeout", type=float, default=2.0)
    parser.add_argument("--checkpoint-every", type=float, default=60.0)
    parser.add_argument("--no-compile", action="store_true", help="a 6 s sleep for the first step")
    args = parser.parse_args()

    events: list[tuple[str, dict[str, object]]] = []
    torchmon.register_event_handler(
        lambda e: events.append((e.name, dict(e.data))) if e.name.startswith("torchmon.") else None
    )
    dump_dir = tempfile.mkdtemp(prefix="torchmon-soak-")
    wd = torchmon.Watchdog(
        min_timeout=args.min_timeout, factor=5.0, dump_dir=dump_dir, report_interval=10.0
    )
    start = time.monotonic()
    with wd.section("compile"):
        if args.no_compile:
            time.sleep(6.0)
        else:
            import torch

            model = torch.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()))
            model(torch.randn(8, 64)).sum().backward()
    wd.beat()
    print(
        f"first step (compile): {time.monotonic() - start:.1f} s; timeout then {wd.timeout:.1f} s"
    )
    rng = random.Random(0)
    end = start + args.minutes * 60
    next_checkpoint = time.monotonic() + args.checkpoint_every
    steps = checkpoints = 0
    while time.monotonic() < end:
        with wd.section("compute"):
            time.sleep(0.02 * (5 if rng.random() < 0.02 else rng.uniform(0.5, 1.5)))
        wd.beat()
        steps += 1
        if time.monotonic() >= next_checkpoint:
            with wd.paused():
                time.sleep(3 * wd.timeout)
            checkpoints += 1
            next_checkpoint = time.monotonic() + args.checkpoint_every
            print(
                f"{(time.monotonic() - start) / 60:5.1f} min: {steps} steps, "
                f"timeout {wd.timeout:.2f} s"
            )
    wd.close()
    hangs = [data for name, data in events if name == "torchmon.hang"]
    print(
        f"{steps} steps, {checkpoints} paused checkpoints, "
        f"{time.monotonic() - start:.0f} s: {len(hangs)} hangs reported"
    )
    for data in hangs:
        print("  hang:", data)
    return 1 if hangs else 0


if __name__ == "__main__":
    sys.exit(main())
