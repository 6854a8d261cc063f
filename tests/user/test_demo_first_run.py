"""README's command 1 as a new user meets it: `torchmon demo` in a checkout
whose venv is not activated, then the commands the demo prints, run exactly
as printed from the same directory (docs/cli.md, `torchmon demo`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard_server import Server

from torchmon.handlers.jsonl import read_jsonl

REPO = Path(__file__).resolve().parents[2]


def venv_root() -> Path:
    prefix = Path(sys.prefix)
    if sys.prefix == sys.base_prefix or not (prefix / "pyvenv.cfg").is_file():
        pytest.skip("the tests do not run in a venv")
    return prefix


def without_venv_on_path(venv: Path) -> dict[str, str]:
    """The environment of a shell in which the venv is not activated."""
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    bin_dir = Path(sys.executable).parent.resolve()
    kept = []
    for entry in env.get("PATH", "").split(os.pathsep):
        try:
            if entry and Path(entry).resolve() == bin_dir:
                continue
        except OSError:
            pass
        kept.append(entry)
    env["PATH"] = os.pathsep.join(kept)
    return env


def printed_command(out: str, pattern: str) -> str:
    found = re.findall(rf"^  ({pattern})$", out, flags=re.MULTILINE)
    assert len(found) == 1, out
    return found[0]


def test_the_next_steps_the_demo_prints_run_as_printed_without_activating_the_venv(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboardX")
    pytest.importorskip("tensorboard")
    venv = venv_root()
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    # The user's checkout with its .venv, as README's command 1 makes it.
    (checkout / ".venv").symlink_to(venv, target_is_directory=True)
    env = without_venv_on_path(venv)
    if shutil.which("tensorboard", path=env["PATH"]) is not None:
        pytest.skip("a tensorboard outside the venv is on PATH")
    result = subprocess.run(
        [".venv/bin/python", "-m", "torchmon", "demo", "--epochs", "2", "--steps", "700"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summarize = printed_command(result.stdout, r"\S+ summarize \S+")
    tensorboard = printed_command(result.stdout, r"\S+ --logdir \S+")
    (logdir,) = (p for p in checkout.iterdir() if p.name.startswith("torchmon-demo-"))
    assert tensorboard.endswith(f" --logdir {logdir.name}")  # relative to where the user is

    summary = subprocess.run(
        summarize, shell=True, cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )
    assert summary.returncode == 0, summary.stderr
    assert re.search(r"^train\.loss +mean +\d+ ", summary.stdout, flags=re.MULTILINE)

    events = list(read_jsonl(str(logdir / "events.jsonl")))
    windows = sum(1 for e in events if "train.loss.mean" in e.data)
    assert windows >= 2
    server = Server(tensorboard, tmp_path / "tensorboard.log", cwd=checkout, env=env)
    try:
        got = server.wait_for({"."}, {"train.loss.mean": windows})
    finally:
        server.stop()
    assert [step for _, step, _ in got["."]["train.loss.mean"]] == list(range(1, windows + 1))


@pytest.mark.parametrize("where", [".", "examples"])
def test_the_default_demo_directory_is_not_an_untracked_file_of_the_checkout(
    tmp_path: Path, where: str
) -> None:
    git = shutil.which("git")
    if git is None:
        pytest.skip("needs git")
    gitignore = REPO / ".gitignore"
    if not gitignore.is_file():
        pytest.skip("not run from a checkout")
    checkout = tmp_path / "checkout"
    (checkout / where).mkdir(parents=True, exist_ok=True)
    shutil.copy(gitignore, checkout / ".gitignore")
    subprocess.run([git, "init", "-q"], cwd=checkout, check=True, timeout=60)
    result = subprocess.run(
        [sys.executable, "-m", "torchmon", "demo", "--epochs", "1", "--steps", "5"],
        cwd=checkout / where,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert list((checkout / where).glob("torchmon-demo-*/events.jsonl"))
    status = subprocess.run(
        [git, "status", "--porcelain", "--untracked-files=all"],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert status.stdout.splitlines() == ["?? .gitignore"]


def test_the_tensorboard_extra_brings_the_server_and_the_writer() -> None:
    """README's command 1 installs ".[tensorboard]"; the demo writes with
    tensorboardX and its printed next step serves with tensorboard."""
    tomllib = pytest.importorskip("tomllib")
    pyproject, readme = REPO / "pyproject.toml", REPO / "README.md"
    if not (pyproject.is_file() and readme.is_file()):
        pytest.skip("not run from a checkout")
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower() for req in extras["tensorboard"]}
    assert {"tensorboard", "tensorboardx"} <= names
    assert '.venv/bin/pip install ".[tensorboard]" && .venv/bin/torchmon demo' in readme.read_text()


def test_the_demo_shows_the_system_stats_beside_the_training_metrics(tmp_path: Path) -> None:
    """docs/guide.md, "System stats": the demo samples the process and the
    host for its duration, into the same windows and files as its Stats."""
    result = subprocess.run(
        [sys.executable, "-m", "torchmon", "demo", "--epochs", "2", "--steps", "300"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = {tuple(line.split()[:2]) for line in result.stdout.splitlines() if line.strip()}
    assert ("train.loss", "mean") in rows
    for row in (
        ("process.cpu.utilization", "mean"),
        ("process.memory.usage", "value"),
        ("process.thread.count", "value"),
        ("system.cpu.utilization", "mean"),
        ("system.memory.utilization", "mean"),
    ):
        assert row in rows, result.stdout
    (events_file,) = tmp_path.glob("torchmon-demo-*/events.jsonl")
    data: dict[str, float] = {}
    for event in read_jsonl(str(events_file)):
        data.update({k: v for k, v in event.data.items() if isinstance(v, float)})
    # The demo process really is this big and this busy (a fraction of the CPUs).
    assert data["process.memory.usage.max"] > 10 * 2**20
    assert 0.0 < data["process.cpu.utilization.max"] <= 1.0
