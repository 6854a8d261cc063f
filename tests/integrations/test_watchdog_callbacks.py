"""The callbacks' ``watchdog=True`` (docs/stragglers.md, "The callbacks"): the
examples run with ``--watchdog`` in the real Hugging Face Trainer and the
real Lightning Trainer, and every step's sections reach the rank's file
(HF: compute, optimizer, data; Lightning: forward, backward, optimizer,
data), one sample per step each, with no code in the training loop; and
DDP's own compute/communication split read from a real
DistributedDataParallel (one gloo rank) becomes the ``ddp.*`` Stats."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import events, run_example, total, windows_of
from support import run_python

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

STEPS = 12


def section_counts(log_dir: Path, names: list[str]) -> dict[str, float]:
    evs = events(log_dir / "events-rank0.jsonl")
    return {name: total(windows_of(evs, f"section.{name}"), "count") for name in names}


def test_hugging_face_callback_times_the_sections(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    log_dir = tmp_path / "run"
    run_example("hf_trainer.py", f"--log-dir={log_dir}", f"--steps={STEPS}", "--watchdog",
                cwd=tmp_path)  # fmt: skip
    # The data section after the last step ends when training does.
    assert section_counts(log_dir, ["compute", "optimizer", "data"]) == {
        "compute": STEPS,
        "optimizer": STEPS,
        "data": STEPS,
    }


def test_lightning_callback_times_the_sections(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    log_dir = tmp_path / "run"
    run_example("lightning_trainer.py", f"--log-dir={log_dir}", f"--steps={STEPS}",
                "--watchdog", cwd=tmp_path)  # fmt: skip
    assert section_counts(log_dir, ["forward", "backward", "optimizer", "data"]) == {
        "forward": STEPS,
        "backward": STEPS,
        "optimizer": STEPS,
        "data": STEPS,
    }


def test_ddp_timings_become_stats() -> None:
    proc = run_python(
        """
        import os, socket
        import torch, torch.distributed as dist
        import torchmon
        from torchmon.integrations._common import TrainSections

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
        seen = {}
        torchmon.register_event_handler(lambda e: seen.update(e.data))
        wd = torchmon.Watchdog(dump_dir=None, report_interval=0.05)
        sections = TrainSections(wd)
        sections.watch_ddp(torch.nn.Linear(2, 1))  # not DDP: nothing
        assert sections._ddp is None
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
        sections.watch_ddp(model)
        sections.record_ddp()  # before DDP sampled an iteration: nothing
        assert not any(k.startswith("ddp.") for k in seen), seen
        for _ in range(3):
            sections.enter("forward")
            loss = model(torch.randn(4, 8)).sum()
            sections.enter("backward")
            loss.backward()
            sections.leave()
            sections.beat()
        import time; time.sleep(0.06)
        sections.beat()  # a report interval later: DDP's timings read
        for name in ("forward_compute", "backward_compute", "backward_comm"):
            value = seen[f"ddp.{name}.value"]
            assert 0 < value < 10, (name, value)
        sections.close()
        wd.close()
        dist.destroy_process_group()
        print("ok")
        """,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"
