"""torchmon against the shared torch 2.13 conformance vectors.

Two ways: replay.py's own command line, exactly as the README tells a user to
run it (``python replay.py torchmon torch-2.13-vectors.jsonl --show 5``), and
in-process, one test per scenario, so that a failure names its scenario and
shows the first differing op.

The vectors live beside the checkout (``../shared/conformance``), or where
``TORCHMON_SHARED`` says; without that folder these tests skip.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import assert_scenario_replays, load_conformance

import torchmon

replay, SCENARIOS = load_conformance()  # (None, []) without ../shared: tests skip


def test_torchmon_shared_names_the_folder_of_a_checkout_without_one(
    shared_dir: Path, tmp_path: Path
) -> None:
    """A fresh clone has no ../shared: TORCHMON_SHARED points the tests at
    it, and the vectors' tests run instead of skipping (README.md)."""
    tests = tmp_path / "clone" / "tests"
    shutil.copytree(
        Path(__file__).resolve().parents[1], tests, ignore=shutil.ignore_patterns("__pycache__")
    )
    assert not (tmp_path / "shared").exists()
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        "tests/conformance/test_conformance_vectors.py",
        "-k",
        "test_scenario_matches and public-213-0000",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TORCHMON_SHARED"}
    without = subprocess.run(argv, cwd=tests.parent, env=env, capture_output=True, text=True)
    assert " passed" not in without.stdout, without.stdout  # no vectors, no such tests
    env["TORCHMON_SHARED"] = str(shared_dir)
    with_it = subprocess.run(argv, cwd=tests.parent, env=env, capture_output=True, text=True)
    assert with_it.returncode == 0, with_it.stdout + with_it.stderr
    assert "10 passed" in with_it.stdout, with_it.stdout


def _replay_cli(shared_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    conformance = shared_dir / "conformance"
    return subprocess.run(
        [
            sys.executable,
            str(conformance / "replay.py"),
            "torchmon",
            str(conformance / "torch-2.13-vectors.jsonl"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_replay_cli_all_scenarios_match(shared_dir):
    proc = _replay_cli(shared_dir, "--show", "5")
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    assert lines[-1] == "conformance: 400/400 scenarios match", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mismatch" not in proc.stdout


def test_replay_cli_all_scenarios_match_strict_zero(shared_dir):
    """--strict-zero: -0.0 and 0.0 are different (SUM of a lone -0.0 is +0.0, its MIN -0.0)."""
    proc = _replay_cli(shared_dir, "--show", "5", "--strict-zero")
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    assert lines[-1] == "conformance: 400/400 scenarios match", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vectors_present(shared_dir):
    assert len(SCENARIOS) == 400
    assert len({sc["id"] for sc in SCENARIOS}) == 400


@pytest.fixture(scope="module")
def _cheap_gc():
    """Every "del" op runs gc.collect(); leave the objects that already exist out of
    those collections, as replay.py's main() does, and hand them back afterwards."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[sc["id"] for sc in SCENARIOS])
def test_scenario_matches(scenario, shared_dir, _cheap_gc):
    assert_scenario_replays(replay, torchmon, scenario)
