"""WandbEventHandler under torchrun (2 ranks, gloo) with no run given and no
``wandb.run``: the handler starts one run per rank, named ``rank<r>``, in
the group of the job (torchrun's run id), with the rank's labels as its
config, each holding its rank's windows (the JSON lines log of that rank):
the layout docs/sinks.md ("W&B") documents, so that W&B's group view
overlays the ranks' metrics. W&B runs offline (nothing leaves the machine)
and the runs are read back with tests/wandb_offline.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_offline import read_config, read_history, read_records

import torchmon
from torchmon.handlers.wandb import STEP_METRIC

pytest.importorskip("torch.distributed", reason="torch is not installed")
pytest.importorskip("wandb", reason="W&B (the wandb extra) is not installed")

pytestmark = pytest.mark.slow

RANK_SCRIPT = Path(__file__).resolve().parents[1] / "wandb_rank.py"

# As test_sink_wandb.py's offline_env fixture: offline, quiet, every file
# under the test's directory.
OFFLINE_ENV = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_CONSOLE": "off",
}
DROPPED_ENV = ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_SERVICE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def offline_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    return {
        **env,
        **OFFLINE_ENV,
        "WANDB_DIR": str(tmp_path),
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
        "WANDB_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "OMP_NUM_THREADS": "1",
    }


def test_one_run_per_rank(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "--rdzv-id=wandb-ranks",
            str(RANK_SCRIPT),
            str(tmp_path),
        ],
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    paths = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(paths) == 2, paths
    runs = {}
    for path in paths:
        (record,) = [r.run for r in read_records(path) if r.WhichOneof("record_type") == "run"]
        runs[record.display_name] = (path, record)
    assert sorted(runs) == ["rank0", "rank1"]  # one run per rank
    for rank in (0, 1):
        path, record = runs[f"rank{rank}"]
        assert record.run_group == "wandb-ranks"  # the job: both in one group
        config = read_config(path)
        assert (config["rank"], config["local_rank"], config["node"], config["job"]) == (
            str(rank),
            str(rank),
            "0",
            "wandb-ranks",
        )
        assert config["host"]
        history = [(row["train.loss.mean"], row[STEP_METRIC]) for row in read_history(path)]
        windows = [
            e
            for e in torchmon.read_jsonl(tmp_path / f"events-rank{rank}.jsonl")
            if e.name == torchmon.STAT_EVENT
        ]
        want = [(e.data["train.loss.mean"], i + 1) for i, e in enumerate(windows)]
        # By value: wandb writes a float with an integral value as an int.
        assert [(float(v), s) for v, s in history] == want  # type: ignore[arg-type]
        assert all(type(s) is int for _, s in history)
        assert len(want) == 5
