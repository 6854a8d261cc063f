"""tests/wandb_offline.py, the reader of W&B's offline run files that the W&B
sink's tests read back with, against a real offline run: what ``run.log``
was given comes back (values incl. NaN and infinities, ints, steps, order),
through a history large enough to span several 32 KiB blocks and a record
longer than a block. Offline mode: nothing leaves the machine."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import wandb_offline

wandb = pytest.importorskip("wandb")

STEPS = 400
WIDE_STEP = 123  # this step also logs WIDE_KEYS keys: one record over 32 KiB
WIDE_KEYS = 2500


@pytest.fixture
def offline_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """wandb offline, quiet, and confined to tmp_path: no network, no
    writes to the home directory, no error reports."""
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DIR": str(tmp_path),
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
        "WANDB_ARTIFACT_DIR": str(tmp_path / "artifacts"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def logged_rows() -> list[dict[str, Any]]:
    """What the run logs: per step, floats (incl. NaN, +-inf, subnormal and
    integral ones), ints (incl. beyond 2**53) and a nested dict."""
    rng = random.Random(1234)
    specials = [math.nan, math.inf, -math.inf, 5e-324, 1.0, 0.1, 1e308, -2.5e-7]
    rows = []
    for i in range(STEPS):
        row: dict[str, Any] = {
            "loss": rng.random() * 10,
            "lr": 1e-3 * 0.99**i,
            "special": specials[i % len(specials)],
            "count": i * 7,
            "big": 2**62 - i,
            "neg": -i,
            "grad/norm": rng.lognormvariate(0, 3),
            "nested": {"a": float(i) / 3, "b": i},
        }
        if i % 5 == 0:
            row["sometimes"] = math.nan if i % 2 else float(i)
        if i == WIDE_STEP:
            row.update({f"wide/{k:05d}": rng.uniform(-1, 1) for k in range(WIDE_KEYS)})
        rows.append(row)
    return rows


def same(got: Any, want: Any) -> bool:
    """Equal by value (wandb writes 1.0 as 1), NaN equal to NaN, nested dicts
    key by key."""
    if isinstance(want, dict):
        return (
            isinstance(got, dict)
            and got.keys() == want.keys()
            and all(same(got[k], want[k]) for k in want)
        )
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return type(got) in (int, float) and got == want


def test_offline_history_reads_back_as_logged(offline_env: Path) -> None:
    rows = logged_rows()
    run = wandb.init(mode="offline", dir=offline_env, project="t", config={"lr0": 1e-3})
    for i, row in enumerate(rows):
        run.log(row, step=i)
    run.summary["best"] = 0.25
    run_dir = Path(run.dir).parent  # run.dir is <run dir>/files
    run.finish()

    # Waits for wandb-core to write the file's last block (read_records).
    history = wandb_offline.read_history(run_dir)
    path = wandb_offline.wandb_file(run_dir)
    data = path.read_bytes()
    assert len(data) > 4 * wandb_offline.BLOCK_LEN
    payloads = list(wandb_offline.read_payloads(data))
    assert max(map(len, payloads)) > wandb_offline.BLOCK_LEN  # FIRST, MIDDLE+, LAST

    assert [h["_step"] for h in history] == list(range(STEPS))
    for i, (got, want) in enumerate(zip(history, rows)):
        assert isinstance(got.pop("_timestamp"), float)
        assert isinstance(got.pop("_runtime"), float)
        assert got.pop("_step") == i
        assert same(got, want), (i, got, want)
    timestamps = [h["_timestamp"] for h in wandb_offline.read_history(path)]
    assert timestamps == sorted(timestamps)

    # Integral floats come back as JSON integers (the module's docstring).
    assert history[4]["special"] == 1 and type(history[4]["special"]) is int

    summary = wandb_offline.read_summary(run_dir)
    assert summary["best"] == 0.25
    assert summary["_step"] == STEPS - 1
    assert same(summary["nested"], rows[-1]["nested"])
    assert summary["loss"] == rows[-1]["loss"]
    config = wandb_offline.read_config(run_dir)
    assert config["lr0"] == 1e-3


def test_checksum_and_truncation_are_detected(offline_env: Path) -> None:
    run = wandb.init(mode="offline", dir=offline_env, project="t")
    for i in range(50):
        run.log({"x": float(i), "pad": "p" * 2000}, step=i)
    run_dir = Path(run.dir).parent
    run.finish()
    assert len(wandb_offline.read_records(run_dir)) > 50  # waits for the whole file
    data = bytearray(wandb_offline.wandb_file(run_dir).read_bytes())
    assert len(list(wandb_offline.read_payloads(bytes(data)))) > 50

    flipped = bytearray(data)
    flipped[wandb_offline.BLOCK_LEN + 100] ^= 0x01
    with pytest.raises(wandb_offline.FormatError, match=r"checksum|type|overflow"):
        list(wandb_offline.read_payloads(bytes(flipped)))
    with pytest.raises(wandb_offline.FormatError):
        list(wandb_offline.read_payloads(bytes(data[: len(data) - 3])))
    with pytest.raises(wandb_offline.FormatError, match="header"):
        list(wandb_offline.read_payloads(b"LDB" + bytes(data[3:])))
