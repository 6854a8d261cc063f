"""Registry scaling: registering then unregistering N handlers, for two N in one run.

Run:  python benches/bench_registry_scaling.py [--sizes 1000 10000] [--repeat 3]

Each figure is the minimum over ``--repeat`` runs (these machines are noisy)
of registering N distinct handlers and then unregistering them all, in
registration order, with the garbage collector enabled as in a real program.
The last line is the ratio of the largest N's time to the smallest's: a
change that cost O(N) makes it N_large / N_small (10 for 1,000 and 10,000);
docs/performance.md states the goal (at most twice that).
"""

from __future__ import annotations

import argparse
import time

import torchmon


def register_then_unregister(n: int) -> tuple[float, float]:
    """Seconds to register n handlers, then to unregister them."""
    # Distinct callables, created before the clock starts: the registry's
    # cost is measured, not the handlers'.
    handlers = [(lambda event: None) for _ in range(n)]
    start = time.perf_counter()
    handles = [torchmon.register_event_handler(h) for h in handlers]
    registered = time.perf_counter()
    for handle in handles:
        torchmon.unregister_event_handler(handle)
    done = time.perf_counter()
    assert torchmon._core._handler_count() == 0
    return registered - start, done - registered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    totals = {}
    print(f"{'handlers':>9} {'register s':>11} {'unregister s':>13} {'total s':>9}")
    for n in sizes:
        runs = [register_then_unregister(n) for _ in range(args.repeat)]
        reg, unreg = min(runs, key=sum)
        totals[n] = reg + unreg
        print(f"{n:>9} {reg:>11.4f} {unreg:>13.4f} {totals[n]:>9.4f}")
    small, large = sizes[0], sizes[-1]
    ratio = totals[large] / totals[small]
    print(
        f"ratio {large} / {small} handlers: {ratio:.1f}x "
        f"(linear: {large / small:.0f}x, goal: at most {2 * large / small:.0f}x)"
    )


if __name__ == "__main__":
    main()
