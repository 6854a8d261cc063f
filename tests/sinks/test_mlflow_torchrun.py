"""MLflowEventHandler under torchrun (2 ranks, gloo) with no run given: one
run per rank in one experiment, named ``rank<r>`` after the job and tagged
with the rank's labels, each holding its rank's windows (the JSON lines log
of that rank): the layout docs/sinks.md ("MLflow", "Several ranks")
documents, so that MLflow's run comparison overlays the ranks' metrics."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed", reason="torch is not installed")
pytest.importorskip("mlflow", reason="MLflow (the mlflow extra) is not installed")
from mlflow.tracking import MlflowClient

import torchmon

pytestmark = pytest.mark.slow

RANK_SCRIPT = Path(__file__).resolve().parents[1] / "mlflow_rank.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_one_run_per_rank(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # the store's tables, made once
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "--rdzv-id=mlflow-ranks",
            str(RANK_SCRIPT),
            uri,
            str(tmp_path),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("ranks")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    for rank in (0, 1):
        run_id = (tmp_path / f"run-rank{rank}.txt").read_text()
        run = client.get_run(run_id)
        assert run.info.experiment_id == experiment.experiment_id
        assert run.info.run_name == f"mlflow-ranks-rank{rank}"
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert (tags["rank"], tags["local_rank"], tags["node"], tags["job"]) == (
            str(rank),
            str(rank),
            "0",
            "mlflow-ranks",
        )
        history = [
            (m.value, m.step, m.timestamp)
            for m in client.get_metric_history(run_id, "train.loss.mean")
        ]
        want = [
            (float(e.data["train.loss.mean"]), i + 1, int(e.timestamp.timestamp() * 1000))  # type: ignore[arg-type]
            for i, e in enumerate(torchmon.read_jsonl(tmp_path / f"events-rank{rank}.jsonl"))
        ]
        assert sorted(history, key=lambda row: row[1]) == want
        assert len(want) == 5
