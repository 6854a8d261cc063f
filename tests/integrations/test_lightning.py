"""TorchmonLogger and TorchmonCallback in the real Lightning Trainer
(docs/integrations.md): examples/lightning_trainer.py trains a tiny
LightningModule on the CPU in a fresh interpreter, with Lightning's own
CSVLogger beside torchmon's as the record of what was logged; and the logger
pickled as Lightning's own logger tests pickle theirs."""

from __future__ import annotations

import csv
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
from support import run_python

pytest.importorskip("torch")
pytest.importorskip("lightning")

STEPS = 30
#: A deadline for a hung child, not a speed check: importing lightning took
#: over 60 s on a 2-core machine shared with other builds.
TIMEOUT = 240.0


def test_lightning_run_records_step_times_and_what_self_log_logged(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    out = run_example(
        "lightning_trainer.py",
        f"--log-dir={log_dir}",
        f"--steps={STEPS}",
        "--window=1",
        cwd=tmp_path,
    )
    assert f"tensorboard --logdir {log_dir}" in out

    evs = events(log_dir / "events-rank0.jsonl")
    (run,) = [e.data for e in evs if e.name == "torchmon.run"]
    assert (run["framework"], run["rank"], run["world_size"]) == ("lightning", "0", 1)
    step_time = windows_of(evs, "train.step_time")
    check_step_time_windows(step_time, STEPS)
    assert total(windows_of(evs, "train.data_time"), "count") == STEPS - 1

    with (log_dir / "csv" / "version_0" / "metrics.csv").open(newline="") as f:
        logged = [float(row["train_loss"]) for row in csv.DictReader(f) if row["train_loss"]]
    assert len(logged) == STEPS // 5  # log_every_n_steps=5
    check_logged_windows(windows_of(evs, "train_loss"), logged)

    scalars = tensorboard_scalars(log_dir / "rank0")
    assert scalars["train.step_time.p99"] == pytest.approx(
        [w["p99"] for w in step_time], rel=1e-6
    )  # TensorBoard stores float32
    assert scalars["train_loss.max"] == pytest.approx(
        [w["max"] for w in windows_of(evs, "train_loss")], rel=1e-6
    )


def test_the_logger_pickles_with_its_trainer_after_logging(tmp_path: Path) -> None:
    """As Lightning's test_loggers_pickle: the Trainer holding the logger is
    pickled and the copy's logger logs; here after the original made its
    Stats (which do not pickle) and with a hyperparameter event from each."""
    out = tmp_path / "events.jsonl"
    proc = run_python(
        f"""
        import pickle, warnings
        warnings.simplefilter("ignore")
        import torchmon
        from lightning.pytorch import Trainer
        from torchmon.integrations.lightning import TorchmonLogger

        handle = torchmon.register_event_handler(torchmon.JsonlEventHandler({str(out)!r}))
        logger = TorchmonLogger(name="tiny")
        trainer = Trainer(max_epochs=1, logger=logger, enable_progress_bar=False)
        logger.log_metrics({{"acc": 2.0}}, step=0)
        trainer2 = pickle.loads(pickle.dumps(trainer))
        trainer2.logger.log_metrics({{"acc": 1.0}}, step=0)
        trainer2.logger.log_hyperparams({{"lr": 0.1, "net": {{"width": 8, "act": None}}}})
        assert trainer2.logger.name == "tiny" and trainer2.logger.version == 0
        trainer2.logger.finalize("success")
        logger.finalize("success")
        """,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    evs = events(out)
    acc = windows_of(evs, "acc")
    assert sorted(w["sum"] for w in acc) == [1.0, 2.0]  # one Stat each, both emitted
    (hyperparams,) = [e.data for e in evs if e.name == "tiny.hyperparams"]
    assert hyperparams == {"lr": 0.1, "net/width": 8, "net/act": "None"}


def test_step_time_windows_closed_before_the_first_logged_value_reach_the_log(
    tmp_path: Path,
) -> None:
    """TorchmonLogger opens its log_dir sinks when training starts, not at
    the first value Lightning sends it (every log_every_n_steps, 5 in the
    example): with 1 ms windows, the steps before it close windows too, and
    every step is in the file once (docs/integrations.md)."""
    log_dir = tmp_path / "run"
    run_example(
        "lightning_trainer.py",
        f"--log-dir={log_dir}",
        f"--steps={STEPS}",
        "--window=0.001",
        cwd=tmp_path,
    )
    step_time = windows_of(events(log_dir / "events-rank0.jsonl"), "train.step_time")
    assert total(step_time, "count") == STEPS
