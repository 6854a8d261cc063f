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
from typing import Any, Callable

import torch
import torch.monitor as torch_monitor
from torch.func import functional_call, grad_and_value

import torchmon
from torchmon import _compiled

VALUES_PER_STEP = 10


def drop_store(module: Any, name: str, value: Any) -> None:
    """A ``__setattr__`` for ``torchmon._compiled``'s module class that drops
    what a graph run staged (dynamo skips its frame)."""


torch._dynamo.decorators.skip(drop_store)


def _nothing_to_do() -> None:
    pass


def compiled_steps(backend: str, hidden: int) -> dict[str, Any]:
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
    )
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    ours = [
        torchmon.Stat(f"v{i}", [torchmon.MEAN, torchmon.P90], 60.0) for i in range(VALUES_PER_STEP)
    ]

    # A learning-rate warmup on an in-graph step counter, as optimizers with
    # `capturable=True` keep it.
    step = torch.zeros((), dtype=torch.float32)

    def loss_fn(p: Any, x: Any, y: Any, mask: Any) -> Any:
        # The per-token loss of a batch with padding: summed over the tokens
        # the mask keeps, divided by their count.
        error = (functional_call(model, p, (x,)) - y).square().squeeze(-1)
        tokens = mask.sum()
        loss_sum = (error * mask).sum()
        return loss_sum / tokens.clamp(min=1.0), (loss_sum, tokens)

    def core(x: Any, y: Any, mask: Any) -> list[Any]:
        # Every recorded value is one the step computes anyway, so that the
        # step recording nothing computes it too: the loss, its sum and
        # token count, the gradient norms that clip the update, the clip
        # factor and the warmup's learning rate.
        grads, (loss, (loss_sum, tokens)) = grad_and_value(loss_fn, has_aux=True)(
            params, x, y, mask
        )
        norms = [g.norm() for g in grads.values()]  # 4 tensors
        total_norm = torch.linalg.vector_norm(torch.stack(norms))
        clip = torch.clamp(1.0 / (total_norm + 1e-6), max=1.0)
        step.add_(1.0)
        lr = 1e-3 * torch.clamp(step / 100.0, max=1.0)
        for name, grad in grads.items():
            params[name].sub_(lr * clip * grad)
        return [loss, loss_sum, tokens, total_norm, clip, *norms, lr]

    def with_torchmon(x: Any, y: Any, mask: Any) -> Any:
        values = core(x, y, mask)
        for stat, value in zip(ours, values):
            stat.add(value)
        return values[0]

    def returning_values(x: Any, y: Any, mask: Any) -> list[Any]:
        return core(x, y, mask)

    def nothing(x: Any, y: Any, mask: Any) -> Any:
        return core(x, y, mask)[0]

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
    # About one token in ten is padding.
    mask = (torch.rand(args.batch) > 0.1).to(torch.float32)
    steps = compiled_steps(args.backend, args.hidden)
    theirs = [
        torch_monitor.Stat(f"v{i}", [torch_monitor.Aggregation.MEAN], timedelta(seconds=60))
        for i in range(VALUES_PER_STEP)
    ]

    def run_torchmon() -> None:
        steps["torchmon"](x, y, mask)

    def run_item_torch_monitor() -> None:
        for stat, value in zip(theirs, steps["values"](x, y, mask)):
            stat.add(value.item())

    staging_module = type(_compiled)
    native_store = staging_module.__setattr__

    # What the graph, its staging-buffer output and dynamo's replayed store
    # cost without the recording (docs/internals.md, "Tensors in compiled
    # graphs"): the store swapped, around a repeat's timed steps, for one
    # that drops what it is given.
    def drop_stores() -> None:
        staging_module.__setattr__ = drop_store

    def record_stores() -> None:
        staging_module.__setattr__ = native_store

    def run_returning() -> None:
        steps["values"](x, y, mask)

    def run_nothing() -> None:
        steps["nothing"](x, y, mask)

    runs = {
        "torchmon in the step": run_torchmon,
        ".item() + torch.monitor": run_item_torch_monitor,
        "values returned, unread": run_returning,
        "nothing": run_nothing,
    }
    # Run before and after a way's timed steps.
    around: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {}
    if args.breakdown:
        runs["torchmon, nothing recorded"] = run_torchmon
        around["torchmon, nothing recorded"] = (drop_stores, record_stores)
    for name, run in runs.items():  # compile and warm up
        before, after = around.get(name, (_nothing_to_do, _nothing_to_do))
        before()
        for _ in range(3):
            run()
        after()
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs.items())
    for repeat in range(args.repeat):
        # Interleaved, so that the ways of a repeat share the machine's load,
        # and rotated, so that none always runs first.
        shift = repeat % len(order)
        for name, run in order[shift:] + order[:shift]:
            before, after = around.get(name, (_nothing_to_do, _nothing_to_do))
            before()
            start = time.perf_counter()
            for _ in range(args.steps):
                run()
            times[name].append((time.perf_counter() - start) / args.steps * 1e6)
            after()
    baseline = statistics.median(times["nothing"])
    print(
        f"compiled step ({args.backend}, MLP 64-{args.hidden}-1, batch {args.batch}, "
        f"{VALUES_PER_STEP} values recorded), {args.repeat} x {args.steps} steps "
        "(the paired ratio: the median of each repeat's ratio to its 'nothing', "
        "with its quartiles over the repeats and the median's ~95 % interval):"
    )
    print(f"  {'':26s} {'median':>9s} {'min':>9s}  {'paired ratio [q1, q3]':>22s}")
    for name, values in times.items():
        median = statistics.median(values)
        ratios = [v / n for v, n in zip(values, times["nothing"])]
        q1, paired, q3 = statistics.quantiles(ratios, n=4)
        # The median's ~95 % interval (a box plot's notch, 1.58 IQR / sqrt(n)).
        notch = 1.58 * (q3 - q1) / math.sqrt(len(ratios))
        print(
            f"  {name:26s} {median:9.1f} {min(values):9.1f}  {paired:6.3f} [{q1:.3f}, {q3:.3f}]"
            f" +-{notch:.3f}  us/step   ({median / baseline:.3f} x nothing's median)"
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
