"""The scripts in examples/ run as a user would run them, and do what they say.

Each runs in a fresh interpreter, in a temporary working directory, with a
hard timeout; the assertions read what the script wrote (its JSON lines and
TensorBoard files, or the lines it scraped) back independently.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import torchmon

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, cwd: Path, timeout: float = 120.0) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr}"
    return proc.stdout


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(ev.step, ev.value) for ev in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_training_loop_records_every_sample_to_jsonl_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")  # the reader; the example writes without tensorboardX
    logdir = tmp_path / "run"
    out = run_example(
        "training_loop.py",
        "--logdir",
        str(logdir),
        "--epochs",
        "2",
        "--steps",
        "60",
        "--window-ms",
        "50",
        cwd=tmp_path,
    )

    events = list(torchmon.read_jsonl(logdir / "events.jsonl"))
    epochs = [e.data for e in events if e.name == "train.epoch_end"]
    assert [d["epoch"] for d in epochs] == [1, 2]
    assert all(d["steps"] == 60 for d in epochs)
    windows = [e.data for e in events if e.name == torchmon.STAT_EVENT]
    loss = [w for w in windows if "train.loss.count" in w]
    samples = [w for w in windows if "train.sample_loss.count" in w]
    # The open windows are emitted when the Stats are dropped: nothing is lost.
    assert sum(w["train.loss.count"] for w in loss) == 120
    assert sum(w["train.sample_loss.count"] for w in samples) == 120 * 16
    for w in loss:
        assert w["train.loss.min"] <= w["train.loss.mean"] <= w["train.loss.max"]
    assert "train.loss samples over all windows: 120" in out

    scalars = tensorboard_scalars(logdir)
    # TensorBoard stores scalars as float32.
    assert [v for _, v in scalars["train.loss.mean"]] == pytest.approx(
        [w["train.loss.mean"] for w in loss], rel=1e-6
    )
    assert [step for step, _ in scalars["train.epoch_end/loss"]] == [1, 2]
    assert [v for _, v in scalars["train.epoch_end/loss"]] == pytest.approx(
        [d["loss"] for d in epochs], rel=1e-6
    )


def test_training_loop_refuses_a_non_empty_logdir(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("keep me")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "training_loop.py"), "--logdir", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert "not empty" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


_SAMPLE = re.compile(r"^(trainer_train_loss_\w+)\{([^}]*)\} (\S+)$")


def test_multinode_prometheus_serves_gauges_with_the_rank_label(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    out = run_example("multinode_prometheus.py", "--rank", "3", "--job", "pretrain", cwd=tmp_path)

    samples = {}
    for line in out.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            samples[name] = (set(labels.split(",")), float(value))
    assert set(samples) == {
        "trainer_train_loss_mean",
        "trainer_train_loss_max",
        "trainer_train_loss_count",
    }
    for labels, _ in samples.values():
        assert labels == {'job="pretrain"', 'rank="3"'}
    # The values of one window of uniform(0.5, 1.5) samples.
    mean, top, count = (samples[f"trainer_train_loss_{a}"][1] for a in ("mean", "max", "count"))
    assert count >= 1 and count == int(count)
    assert 0.5 <= mean <= top <= 1.5


def test_otel_in_memory_prints_the_last_window_on_gauges(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    out = run_example("otel_in_memory.py", cwd=tmp_path)

    assert f"scope torchmon {torchmon.__version__}" in out.splitlines()
    points = {}
    for line in out.splitlines():
        match = re.match(r"^(train\.loss\.\w+) \{([^}]*)\} (\S+)$", line)
        if match:
            points[match.group(1)] = (match.group(2), float(match.group(3)))
    assert set(points) == {f"train.loss.{a}" for a in ("mean", "min", "max", "count")}
    assert {attrs for attrs, _ in points.values()} == {"job=example,rank=0"}
    low, mean, high = (points[f"train.loss.{a}"][1] for a in ("min", "mean", "max"))
    count = points["train.loss.count"][1]
    assert count >= 1 and count == int(count)
    assert 0.5 <= low <= mean <= high <= 1.5


def test_quickstart_runs_and_reports_its_epochs(tmp_path: Path) -> None:
    out = run_example(
        "quickstart.py",
        "--logdir",
        str(tmp_path / "runs"),
        "--epochs",
        "2",
        "--steps",
        "50",
        cwd=tmp_path,
    )
    assert "100 steps" in out
    epoch_rows = [line.split() for line in out.splitlines() if re.match(r"^\s+[01] ", line)]
    assert [row[0] for row in epoch_rows] == ["0", "1"]


def test_quickstart_writes_each_run_into_a_directory_of_its_own(tmp_path: Path) -> None:
    """Two runs in one directory show in TensorBoard as one run, their points
    mixed: by default each run gets a new one, which it prints."""
    pytest.importorskip("tensorboardX")
    written = []
    for _ in range(2):
        out = run_example("quickstart.py", "--epochs", "1", "--steps", "5", cwd=tmp_path)
        (line,) = [line for line in out.splitlines() if line.startswith("writing TensorBoard")]
        written.append(tmp_path / line.rpartition(" ")[2])
    assert written[0] != written[1]
    assert sorted(p.parent for p in written) == [tmp_path / "runs"] * 2
    for logdir in written:
        (events_file,) = logdir.iterdir()
        assert events_file.name.startswith("events.out.tfevents.")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--logdir", str(written[0])],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2
    assert "not empty" in proc.stderr


def test_quickstart_prints_a_tensorboard_command_that_runs_as_printed(tmp_path: Path) -> None:
    """The venv running the tests need not be activated: the printed command
    names this Python's own tensorboard script, by a path that works from
    the current directory, or by its bare name only when PATH finds it."""
    pytest.importorskip("tensorboardX")
    script = Path(sys.executable).parent / "tensorboard"
    if not script.is_file():
        pytest.skip("the tensorboard package is not installed next to this Python")
    out = run_example(
        "quickstart.py", "--logdir", "runs", "--epochs", "1", "--steps", "5", cwd=tmp_path
    )
    (line,) = [line for line in out.splitlines() if line.startswith("Look at it:")]
    command = shlex.split(line.partition(":")[2])
    assert command[1:] == ["--logdir", "runs"]
    program = command[0]
    found = shutil.which(program) if os.sep not in program else str(tmp_path / program)
    assert found is not None, f"{program!r} does not run from {tmp_path}"
    assert Path(found).resolve() == script.resolve()


@pytest.mark.parametrize("name", ["hf_trainer.py", "lightning_trainer.py"])
def test_trainer_examples_print_next_steps_that_run_as_printed(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As quickstart's: the venv need not be activated, the printed commands
    name this Python's own scripts by a path that works from the current
    directory. (The examples themselves need their frameworks; their
    next_steps() needs nothing.)"""
    import runpy

    example = runpy.run_path(str(EXAMPLES / name), run_name="example")
    monkeypatch.chdir(tmp_path)
    summarize, tensorboard = example["next_steps"](tmp_path / "run dir")
    expected = {"torchmon": summarize, "tensorboard": tensorboard}
    for script_name, line in expected.items():
        script = Path(sys.executable).parent / script_name
        if not script.is_file():
            assert f"{shlex.quote(sys.executable)} -m " in line
            continue
        program = shlex.split(line)[0]
        found = shutil.which(program) if os.sep not in program else str(tmp_path / program)
        assert found is not None, f"{program!r} does not run from {tmp_path}"
        assert Path(found).resolve() == script.resolve()
    assert shlex.split(summarize)[1:] == ["summarize", f"{tmp_path}/run dir/events-rank*.jsonl"]
    assert shlex.split(tensorboard)[-2:] == ["--logdir", f"{tmp_path}/run dir"]


@pytest.mark.parametrize("name", ["torchrun_prometheus.py", "preemptible_training.py"])
def test_examples_that_need_torch_say_so_without_a_traceback(name: str, tmp_path: Path) -> None:
    # torch made unimportable, as in an environment without it.
    runner = (
        "import runpy, sys\n"
        "sys.modules['torch'] = None\n"
        "sys.argv = [sys.argv[1]]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", runner, str(EXAMPLES / name)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"examples/{name} needs PyTorch, which is not installed: pip install torch "
        "(or the CPU wheel: pip install --index-url https://download.pytorch.org/whl/cpu torch)"
    ]


def test_torchrun_prometheus_writes_outside_the_checkout_and_says_when_it_is_done(
    tmp_path: Path,
) -> None:
    """One rank, with the environment torchrun gives it: without --out-dir
    the events go under the temporary directory, in a folder named after
    the job, not into the current directory; the script says when training
    is done and how long it keeps serving."""
    pytest.importorskip("torch.distributed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master_port = s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": "job7",
        "TMPDIR": str(temporary),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "torchrun_prometheus.py"),
            "--steps=3",
            "--step-ms=0",
            f"--port-base={metrics_port}",
            "--linger=0.2",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == []
    events = temporary / "torchmon-job7" / "events-rank0.jsonl"
    assert len(list(torchmon.read_jsonl(events))) >= 1
    lines = proc.stdout.splitlines()
    assert f"events go to {events.parent}/events-rank<R>.jsonl" in lines
    assert any(
        re.fullmatch(
            rf"rank 0: training done, 3 steps in [0-9.]+ s; serving "
            rf"http://127\.0\.0\.1:{metrics_port}/metrics for 0\.2 s more \(--linger\)",
            line,
        )
        for line in lines
    ), lines
    assert lines[-1] == "rank 0: stopped serving"


def test_preemptible_training_runs_as_the_readme_says_and_names_its_files(
    tmp_path: Path,
) -> None:
    """README.md's command, ``.venv/bin/python examples/<name>`` from the
    checkout, with no argument: the files go to a new directory under the
    temporary directory (not the checkout), named by the last line."""
    pytest.importorskip("torch")
    checkout = EXAMPLES.parent
    readme = checkout / "README.md"
    if not readme.is_file():
        pytest.skip("not run from a checkout: README.md is not beside tests/")
    assert "(`.venv/bin/python examples/<name>`" in readme.read_text(encoding="utf-8")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    before = sorted(p.name for p in checkout.iterdir())
    proc = subprocess.run(
        [sys.executable, "examples/preemptible_training.py"],
        cwd=checkout,
        env={**os.environ, "TMPDIR": str(temporary), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in checkout.iterdir()) == before
    # torch may leave its own folders there (torchinductor_<user>).
    (out,) = temporary.glob("torchmon-preemptible-*")
    lines = proc.stdout.splitlines()
    assert "trained 20 steps" in lines[-2]
    assert lines[-1] == f"files in {out}: main.jsonl, worker-<pid>.jsonl, truth-<pid>.jsonl"
    counts = [
        e.data["train.loss.count"]
        for e in torchmon.read_jsonl(out / "main.jsonl")
        if e.name == torchmon.STAT_EVENT and "train.loss.count" in e.data
    ]
    assert sum(counts) == 20
    assert len(list(out.glob("worker-*.jsonl"))) == 2


def test_the_readme_names_every_example_script_before_its_first_section() -> None:
    """README.md's first screen lists every script of examples/ (the set-up
    commands come first, then the list)."""
    if not (EXAMPLES.parent / "README.md").is_file():
        pytest.skip("not run from a checkout: README.md is not beside tests/")
    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    first_screen = readme.split("\n## ", 1)[0]
    scripts = sorted(path.name for path in EXAMPLES.glob("*.py"))
    assert scripts
    missing = [name for name in scripts if f"(examples/{name})" not in first_screen]
    assert missing == []


def test_watchdog_hang_prints_the_hang_and_the_stack(tmp_path: Path) -> None:
    out = run_example("watchdog_hang.py", "--dump-dir", str(tmp_path / "dumps"), cwd=tmp_path)
    assert "torchmon.hang: {'rank': 0" in out
    assert "torchmon.resumed:" in out
    assert 'in section "compute", after 50 steps' in out
    assert " in stuck_in_a_c_call\n" in out
    assert len(list((tmp_path / "dumps").glob("hang-rank0-*.txt"))) == 1
