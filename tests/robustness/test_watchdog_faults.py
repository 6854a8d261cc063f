"""torchmon.Watchdog under hostile or failing surroundings (docs/watchdog.md):
a symlink planted in the dump directory, a c10d store that hangs or dies,
signals and section names that are refused, and ranks whose clocks differ.

Every scenario runs in child processes bounded by timeouts and stopped by
pid; stores are real torch TCPStores, ranks real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import free_port, stop_group

# The prelude of every child: the torchmon.* Events it sees, written to OUT
# as JSON at the end (`finish()`).
PRELUDE = """
import json, os, sys, time
import torchmon
OUT = {out!r}
DUMPS = {dumps!r}
events = []
def _record(event):
    if event.name.startswith("torchmon."):
        events.append({{"name": event.name, "data": dict(event.data)}})
torchmon.register_event_handler(_record)
def finish(**extra):
    with open(OUT, "w") as f:
        json.dump({{"events": events, **extra}}, f)
"""


def start_child(
    tmp_path: Path, body: str, env: dict[str, str] | None = None, name: str = "out"
) -> subprocess.Popen[str]:
    out = tmp_path / f"{name}.json"
    code = PRELUDE.format(out=str(out), dumps=str(tmp_path / "dumps")) + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_child(
    proc: subprocess.Popen[str], timeout: float = 60.0
) -> tuple[int, str, str]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)  # type: ignore[arg-type]
        pytest.fail(f"the child did not exit within {timeout} s")
    finally:
        if proc.poll() is None:
            stop_group(proc)  # type: ignore[arg-type]
    return proc.returncode, stdout, stderr


def run_child(
    tmp_path: Path, body: str, env: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[str, dict[str, Any]]:
    code, _, stderr = wait_child(start_child(tmp_path, body, env), timeout)
    assert code == 0, stderr
    return stderr, json.loads((tmp_path / "out.json").read_text())


# -- files written into the dump directory ----------------------------------


def test_a_symlink_planted_at_the_flight_recorder_name_is_not_followed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    stderr, out = run_child(
        tmp_path,
        f"""
        import torch
        import torch.distributed as dist
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
        dist.all_reduce(torch.ones(2))  # an entry for the flight recorder
        os.makedirs(DUMPS)
        # The names are predictable: the first dump of this pid.
        base = os.path.join(DUMPS, f"hang-rank0-pid{{os.getpid()}}-1")
        os.symlink({str(victim)!r}, base + ".flight-recorder.json")
        wd = torchmon.Watchdog(min_timeout=0.3, first_timeout=0.3, warmup_beats=0,
                               dump_dir=DUMPS, report_interval=60.0)
        time.sleep(1.2)
        wd.close()
        dist.destroy_process_group()
        finish(base=base)
        """,
        env={"TORCH_FR_BUFFER_SIZE": "2000"},
    )
    assert victim.read_text() == "precious"
    base = out["base"]
    assert [e["name"] for e in out["events"]] == ["torchmon.hang"]
    assert out["events"][0]["data"]["dump"] == base + ".txt"
    # The hang did write torch's state: the other file, which nobody planted,
    # is there and is a file of its own.
    counters = Path(base + ".wait-counters.json")
    assert counters.is_file() and not counters.is_symlink()
    json.loads(counters.read_text())
    assert os.path.islink(base + ".flight-recorder.json")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [
        f"torchmon: the watchdog could not write {base}.flight-recorder.json: "
        "a file or symlink is already there (left as it is)"
    ], stderr
