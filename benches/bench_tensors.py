"""Recording tensors: a compiled training step with 10 values recorded, and
the eager cost of `Stat.add(tensor)` (docs/guide.md, "Recording tensors and
torch.compile"; figures in docs/performance.md).

Run:  python benches/bench_tensors.py [--steps 200] [--repeat 7] [--backend inductor]
                                     [--hidden 128] [--batch 32]

1. A small MLP step (forward, backward by torch.func, gradient clipping by
   the global norm, SGD update), compiled with ``fullgraph=True``, four ways,
   in one process: recording 10 values into torchmon Stats inside the
   compiled step; returning the 10 values and recording them with
   ``.item()`` into torch.monitor Stats (what users write today); returning
   them unread (what computing them costs); recording nothing (the values
   only a recording needs, the token count and two means, are then not
   computed). Each way runs ``--repeat`` times ``--steps`` steps,
   interleaved; printed per way in microseconds per step: the median and the
   minimum, and the median of each repeat's ratio to the step recording
   nothing in the same repeat. ``--breakdown`` adds the torchmon step with
   its recorder swapped for one that records nothing: the graph's and
   dynamo's share of torchmon's cost.
2. Eager, ns per call (minimum over ``--repeat`` runs): ``stat.add(t)`` of a
   CPU scalar tensor, ``stat.add(t.item())``, and ``math.fabs(1.5)``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import timeit
from datetime import timedelta
from typing import Any

import torch
import torch.monitor as torch_monitor
from torch.func import functional_call, grad_and_value

import torchmon
from torchmon import _compiled

VALUES_PER_STEP = 10


def drop_staged(staged: Any) -> None:
    """A recorder of ``torchmon._compiled`` that records nothing (dynamo
    skips its frame, as it skips the real recorder's)."""


torch._dynamo.decorators.skip(drop_staged)


def compiled_steps(backend: str, hidden: int) -> dict[str, Any]:
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    ours = [
        torchmon.Stat(f"v{i}", [torchmon.MEAN, torchmon.P90], 60.0) for i in range(VALUES_PER_STEP)
    ]

    def loss_fn(p: Any, x: Any, y: Any) -> Any:
        return torch.nn.functional.mse_loss(functional_call(model, p, (x,)), y)

    def core(x: Any, y: Any) -> list[Any]:
        # What a training step computes anyway (the gradient norms clip the
        # update), so that the step recording nothing computes them too;
        # only the token count and the two means are extra.
        grads, loss = grad_and_value(loss_fn)(params, x, y)
        norms = [g.norm() for g in grads.values()]  # 4 tensors
        total_norm = torch.linalg.vector_norm(torch.stack(norms))
        clip = torch.clamp(1.0 / (total_norm + 1e-6), max=1.0)
        for name, grad in grads.items():
            params[name].sub_(1e-3 * clip * grad)
        tokens = (x > 0).sum()
        return [loss, total_norm, clip, *norms, tokens, x.abs().mean(), y.abs().mean()]

    def with_torchmon(x: Any, y: Any) -> Any:
        values = core(x, y)
        for stat, value in zip(ours, values):
            stat.add(value)
        return values[0]

    def returning_values(x: Any, y: Any) -> list[Any]:
        return core(x, y)

    def nothing(x: Any, y: Any) -> Any:
        return core(x, y)[0]

    return {
        "torchmon": torch.compile(with_torchmon, fullgraph=True, backend=backend),
        "values": torch.compile(returning_values, fullgraph=True, backend=backend),
        "nothing": torch.compile(nothing, fullgraph=True, backend=backend),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--hidden", type=int, default=128, help="the MLP's hidden width")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="add the torchmon step with its recorder dropping what the graph staged",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = torch.randn(args.batch, 64), torch.randn(args.batch, 1)
    steps = compiled_steps(args.backend, args.hidden)
    theirs = [
        torch_monitor.Stat(f"v{i}", [torch_monitor.Aggregation.MEAN], timedelta(seconds=60))
        for i in range(VALUES_PER_STEP)
    ]

    def run_torchmon() -> None:
        steps["torchmon"](x, y)

    def run_item_torch_monitor() -> None:
        for stat, value in zip(theirs, steps["values"](x, y)):
            stat.add(value.item())

    def run_torchmon_unrecorded() -> None:
        # What the graph, its staging-buffer output and dynamo's replayed
        # store cost without the recording (docs/internals.md, "Tensors in
        # compiled graphs"): the recorder swapped for one that drops them.
        recorder = _compiled._recorder
        _compiled._recorder = drop_staged
        try:
            steps["torchmon"](x, y)
        finally:
            _compiled._recorder = recorder

    def run_returning() -> None:
        steps["values"](x, y)

    def run_nothing() -> None:
        steps["nothing"](x, y)

    runs = {
        "torchmon in the step": run_torchmon,
        ".item() + torch.monitor": run_item_torch_monitor,
        "values returned, unread": run_returning,
        "nothing": run_nothing,
    }
    if args.breakdown:
        runs["torchmon, nothing recorded"] = run_torchmon_unrecorded
    for run in runs.values():  # compile and warm up
        for _ in range(3):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs.items())
    for repeat in range(args.repeat):
        # Interleaved, so that the ways of a repeat share the machine's load,
        # and rotated, so that none always runs first.
        shift = repeat % len(order)
        for name, run in order[shift:] + order[:shift]:
            start = time.perf_counter()
            for _ in range(args.steps):
                run()
            times[name].append((time.perf_counter() - start) / args.steps * 1e6)
    baseline = statistics.median(times["nothing"])
    print(
        f"compiled step ({args.backend}, MLP 64-{args.hidden}-1, batch {args.batch}, "
        f"{VALUES_PER_STEP} values recorded), {args.repeat} x {args.steps} steps "
        "(the paired ratio: the median of each repeat's ratio to its 'nothing'):"
    )
    print(f"  {'':26s} {'median':>9s} {'min':>9s}  {'paired ratio':>12s}")
    for name, values in times.items():
        median = statistics.median(values)
        paired = statistics.median(v / n for v, n in zip(values, times["nothing"]))
        print(
            f"  {name:26s} {median:9.1f} {min(values):9.1f}  {paired:12.3f}  us/step"
            f"   ({median / baseline:.3f} x nothing's median)"
        )

    stat = torchmon.Stat("eager", [torchmon.MEAN, torchmon.P90], 3600.0)
    t = torch.tensor(1.5)
    env = {"stat": stat, "t": t, "math": math}
    print(f"eager, ns per call (min of {args.repeat} x {args.number}):")
    fabs = (
        min(timeit.Timer("math.fabs(1.5)", globals=env).repeat(args.repeat, args.number))
        / args.number
        * 1e9
    )
    for label, stmt in (
        ("stat.add(t)", "stat.add(t)"),
        ("stat.add(t.item())", "stat.add(t.item())"),
        ("math.fabs(1.5)", "math.fabs(1.5)"),
    ):
        ns = (
            min(timeit.Timer(stmt, globals=env).repeat(args.repeat, args.number))
            / args.number
            * 1e9
        )
        print(f"  {label:26s} {ns:9.1f} ns   {ns / fabs:6.2f} x math.fabs(1.5)")
    del fabs


if __name__ == "__main__":
    main()
