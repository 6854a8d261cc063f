"""multiprocessing's fork and forkserver children flush their live Stats when
multiprocessing ends them with os._exit() (docs/reliability.md "Workers"),
and so do torch DataLoader workers. spawn children end through the normal
interpreter exit and are the control. Each scenario runs in a fresh
interpreter with a timeout."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import textwrap
from pathlib import Path

import pytest
from support import run_python

TIMEOUT = 120.0

_SCRIPT = """
import datetime as dt, os, sys
{import_before}
import multiprocessing as mp
{import_after}

KEEP = []

def child(path, n, use_async):
    import torchmon as m
    sink = m.JsonlEventHandler(path)
    m.register_event_handler(m.AsyncEventHandler(sink) if use_async else sink)
    stat = m.Stat("child.items", [m.COUNT, m.SUM], dt.timedelta(seconds=60))
    KEEP.append(stat)  # alive until the process ends: no destruction flush
    for v in range(n):
        stat.add(float(v))
    counter = m.WaitCounter("child.wait", window_size=dt.timedelta(seconds=60))
    for _ in range(n):
        with counter.guard():
            pass

if __name__ == "__main__":
    ctx = mp.get_context({method!r})
    procs = []
    for k in range(3):
        path = os.path.join({out!r}, f"child{{k}}.jsonl")
        p = ctx.Process(target=child, args=(path, k + 1, {use_async!r}))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(60)
        print("exitcode", p.exitcode)
"""


def windows(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    return [
        e["data"]
        for e in map(json.loads, path.read_text(encoding="utf-8").splitlines())
        if e["name"] == "torch.monitor.Stat"
    ]


METHODS = [
    m for m in ("fork", "forkserver", "spawn") if m in multiprocessing.get_all_start_methods()
]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    "parent_imports", ["before-multiprocessing", "after-multiprocessing", "never"]
)
@pytest.mark.parametrize("method", METHODS)
def test_every_child_window_arrives(
    tmp_path: Path, method: str, parent_imports: str, use_async: bool
) -> None:
    """torchmon imported by the parent before multiprocessing (hooked at the
    fork), after it (hooked at import), or only in the child's target."""
    script = tmp_path / "job.py"
    script.write_text(
        _SCRIPT.format(
            import_before="import torchmon" if parent_imports.startswith("before") else "",
            import_after="import torchmon" if parent_imports.startswith("after") else "",
            method=method,
            out=str(tmp_path),
            use_async=use_async,
        )
    )
    run_script = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    proc = run_python(run_script, TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["exitcode", "0"] * 3, proc.stdout + proc.stderr
    for k in range(3):
        n = k + 1
        got = windows(tmp_path / f"child{k}.jsonl")
        assert {"child.items.count": float(n), "child.items.sum": float(sum(range(n)))} in got
        (wait,) = [w for w in got if "child.wait.count" in w]
        assert wait["child.wait.count"] == float(n)


def test_the_hook_does_not_import_multiprocessing() -> None:
    proc = run_python(
        """
        import sys
        import torchmon
        print("multiprocessing" in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


@needs_torch
@pytest.mark.skipif("fork" not in METHODS, reason="needs the fork start method")
def test_torch_dataloader_fork_workers_flush_their_windows(tmp_path: Path) -> None:
    """Each worker records into a Stat created at import (inherited through
    the fork) and writes to its own JSON lines file opened in worker_init_fn;
    every item a worker loaded is in its file when the loop ends."""
    code = textwrap.dedent(
        f"""
        import datetime as dt, os
        import torch
        from torch.utils.data import DataLoader, Dataset, get_worker_info
        import torchmon as m

        OUT = {str(tmp_path)!r}
        loaded = m.Stat("worker.items", [m.COUNT, m.SUM], dt.timedelta(seconds=60))

        class Items(Dataset):
            def __len__(self):
                return 40
            def __getitem__(self, i):
                loaded.add(float(i))
                return torch.tensor([float(i), float(get_worker_info().id)])

        def worker_init(worker_id):
            path = os.path.join(OUT, f"worker{{worker_id}}.jsonl")
            m.register_event_handler(m.JsonlEventHandler(path))

        loader = DataLoader(Items(), batch_size=4, num_workers=2,
                            multiprocessing_context="fork", worker_init_fn=worker_init)
        per_worker = {{0: [], 1: []}}
        for batch in loader:
            for i, w in batch.tolist():
                per_worker[int(w)].append(i)
        for w, items in per_worker.items():
            print(w, len(items), sum(items))
        """
    )
    proc = run_python(code, TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    expected = {}
    for line in proc.stdout.splitlines():
        w, n, total = line.split()
        expected[int(w)] = (float(n), float(total))
    assert sorted(expected) == [0, 1]
    for w, (n, total) in expected.items():
        got = windows(tmp_path / f"worker{w}.jsonl")
        counts = sum(d["worker.items.count"] for d in got)
        sums = sum(d["worker.items.sum"] for d in got)
        assert (counts, sums) == (n, total), got


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None
    or importlib.util.find_spec("tensorboard") is None
    or "fork" not in METHODS,
    reason="needs torch, tensorboard and the fork start method",
)
def test_a_tensorboard_writer_inherited_through_fork_is_not_flushed_in_the_child(
    tmp_path: Path,
) -> None:
    """The child has the parent's writer object but not its writer thread:
    flushing it there (torch.utils.tensorboard's flush waits for that thread)
    would wait for ever. torchmon flushes a sink only in the process that made
    it."""
    code = textwrap.dedent(
        f"""
        import datetime as dt, multiprocessing as mp, os
        from torch.utils.tensorboard import SummaryWriter
        import torchmon as m

        writer = SummaryWriter({str(tmp_path / "tb")!r})
        tb = m.TensorboardEventHandler(writer)
        h = m.register_event_handler(tb)
        writer.add_scalar("parent", 1.0)  # starts the writer's thread, in the parent
        writer.flush()
        KEEP = []

        def child(path):
            # The inherited handler stays registered: the child's window is
            # queued for a writer thread that does not exist here.
            m.register_event_handler(m.JsonlEventHandler(path))
            KEEP.append(m.Stat("child.items", [m.COUNT], dt.timedelta(seconds=60)))
            KEEP[-1].add(1.0)

        if __name__ == "__main__":
            p = mp.get_context("fork").Process(
                target=child, args=({str(tmp_path / "child.jsonl")!r},))
            p.start()
            p.join(20)
            print("exitcode", p.exitcode)
            if p.exitcode is None:
                p.kill()
        """
    )
    proc = run_python(code, TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["exitcode", "0"], proc.stdout + proc.stderr
    assert windows(tmp_path / "child.jsonl") == [{"child.items.count": 1.0}]
