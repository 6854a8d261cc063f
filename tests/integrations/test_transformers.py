"""TorchmonCallback in the real Hugging Face Trainer (docs/integrations.md):
examples/hf_trainer.py trains a tiny GPT-2 built from a config in code, on
the CPU, in a fresh interpreter; what it wrote is checked against what the
Trainer itself logged (its trainer_state.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runs import (
    check_logged_windows,
    check_step_time_windows,
    events,
    run_example,
    tensorboard_scalars,
    total,
    windows_of,
)

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

STEPS = 30


def test_trainer_run_records_step_times_and_the_logged_values(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    out = run_example(
        "hf_trainer.py", f"--log-dir={log_dir}", f"--steps={STEPS}", "--window=1", cwd=tmp_path
    )
    assert f"torchmon summarize {log_dir}/events-rank*.jsonl" in out

    evs = events(log_dir / "events-rank0.jsonl")
    run = [e.data for e in evs if e.name == "torchmon.run"]
    assert run == [
        {
            "framework": "transformers",
            "rank": "0",
            "local_rank": "0",
            "node": "0",
            "job": "",
            "world_size": 1,
            "host": run[0]["host"],
        }
    ]
    step_time = windows_of(evs, "train.step_time")
    check_step_time_windows(step_time, STEPS)
    data_time = windows_of(evs, "train.data_time")
    assert total(data_time, "count") == STEPS - 1  # between consecutive steps

    history = json.loads((log_dir / "trainer_state.json").read_text())["log_history"]
    logs = [entry for entry in history if "loss" in entry]
    assert len(logs) == STEPS // 5  # logging_steps=5
    for key in ("loss", "learning_rate", "grad_norm"):
        check_logged_windows(windows_of(evs, f"train.{key}"), [entry[key] for entry in logs])

    # 8 sequences of 16 tokens per step; the first step has no previous end to count from.
    tokens = windows_of(evs, "train.tokens_per_second")
    assert total(tokens, "count") == STEPS - 1
    assert min(w["min"] for w in tokens) > 0

    (summary,) = [e.data for e in evs if e.name == "train.summary"]
    assert summary["global_step"] == STEPS
    assert summary["train_loss"] == history[-1]["train_loss"]

    scalars = tensorboard_scalars(log_dir / "rank0")
    assert scalars["train.step_time.p99"] == pytest.approx(
        [w["p99"] for w in step_time], rel=1e-6
    )  # TensorBoard stores float32
    assert scalars["train.loss.sum"] == pytest.approx(
        [w["sum"] for w in windows_of(evs, "train.loss")], rel=1e-6
    )
