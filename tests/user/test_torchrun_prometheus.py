"""examples/torchrun_prometheus.py under real torchrun (4 ranks, gloo), scraped
by a real Prometheus server, queried over its HTTP API as docs/guide.md
("Multi-node setups") shows.

One job per module (a fixture): Prometheus starts on 127.0.0.1 with its own
TSDB and a 1 s scrape of the four rank endpoints, the ranks train for several
windows, write what they recorded exactly (their ground-truth files), keep
serving, and the queries run once Prometheus has scraped every rank after
that. Both process trees are stopped by pid, with timeouts, whatever happens.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

import torchmon

pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_prometheus.py"
PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None
)
RANKS = 4
# Deadlines (not assertions about speed): how long to wait before giving up.
START_TIMEOUT = 90.0
SCRAPE_TIMEOUT = 20.0
STOP_TIMEOUT = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_run(count: int) -> int:
    """A port p with p .. p + count - 1 all free a moment ago."""
    for _ in range(100):
        base = free_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    pytest.fail(f"no {count} consecutive free ports on 127.0.0.1")


def stop_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signals the process group of ``proc`` (a session leader), waits, then kills it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=STOP_TIMEOUT)


def kill_group_of(pid: int) -> None:
    """SIGKILLs the process group led by ``pid`` if it is still alive (torchrun
    starts each rank in a session of its own)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Job:
    query: Callable[[str], list[dict[str, Any]]]
    truth: list[dict[str, Any]]  # each rank's ground-truth file, by rank
    events_dir: Path
    seconds: float
    finished: float


def http_get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode("utf-8"))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary (Debian: apt-get install prometheus; .ci/run does)")
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("torchrun_prometheus")
    port_base = free_port_run(RANKS)
    targets = ", ".join(f"'127.0.0.1:{port_base + rank}'" for rank in range(RANKS))
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: torchrun\n"
        "    static_configs:\n"
        f"      - targets: [{targets}]\n",
        encoding="utf-8",
    )
    web_port = free_port()
    api = f"http://127.0.0.1:{web_port}"
    prometheus_log = (tmp / "prometheus.log").open("wb")
    torchrun_log_path = tmp / "torchrun.log"
    torchrun_log = torchrun_log_path.open("wb")
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=prometheus_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    torchrun: subprocess.Popen[bytes] | None = None
    try:
        truth_dir = tmp / "truth"
        events_dir = tmp / "events"
        torchrun = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={RANKS}",
                "--master-addr=127.0.0.1",
                f"--master-port={free_port()}",
                "--rdzv-id=torchmon-e2e",
                str(EXAMPLE),
                "--steps=150",
                "--step-ms=20",
                "--window-ms=500",
                f"--port-base={port_base}",
                f"--out-dir={events_dir}",
                f"--ground-truth={truth_dir}",
                "--linger=120",
            ],
            cwd=tmp,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdin=subprocess.DEVNULL,
            stdout=torchrun_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def query(promql: str) -> list[dict[str, Any]]:
            url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
            reply = http_get_json(url)
            assert reply["status"] == "success", reply
            return list(reply["data"]["result"])

        def log_tail() -> str:
            return torchrun_log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

        # Every rank trained, emitted its last windows and wrote what it recorded.
        truth_paths = [truth_dir / f"ground-truth-rank{rank}.json" for rank in range(RANKS)]
        deadline = time.monotonic() + START_TIMEOUT
        while not all(path.exists() for path in truth_paths):
            if torchrun.poll() is not None:
                pytest.fail(f"torchrun exited {torchrun.returncode} early:\n{log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the ranks did not finish training in {START_TIMEOUT} s:\n{log_tail()}"
                )
            time.sleep(0.2)
        truth = [json.loads(path.read_text(encoding="utf-8")) for path in truth_paths]
        finished = max(path.stat().st_mtime for path in truth_paths)

        # Then until every rank was scraped (successfully) after its last windows.
        deadline = time.monotonic() + SCRAPE_TIMEOUT
        while True:
            # timestamp() of a bare selector is the scrape's time (of an
            # expression such as `up == 1`, the query's): ask for both apart.
            scrapes = query('timestamp(up{job="torchrun"})')
            up = query('up{job="torchrun"}')
            if (
                len(scrapes) == RANKS
                and min(float(s["value"][1]) for s in scrapes) > finished
                and [float(u["value"][1]) for u in up] == [1.0] * RANKS
            ):
                break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"Prometheus did not scrape every rank after {finished}: {scrapes}; "
                    f"targets: {http_get_json(api + '/api/v1/targets')}"
                )
            time.sleep(0.25)
        yield Job(query, truth, events_dir, time.monotonic() - started, finished)
    finally:
        worker_pids = [
            int(pid)
            for pid in re.findall(
                r"\(pid (\d+)\)", torchrun_log_path.read_text(encoding="utf-8", errors="replace")
            )
        ]
        if torchrun is not None:
            stop_group(torchrun)
        for pid in worker_pids:
            kill_group_of(pid)
        stop_group(prometheus)
        torchrun_log.close()
        prometheus_log.close()


def values_by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {item["metric"][label]: float(item["value"][1]) for item in result}


def test_sum_over_ranks_equals_what_every_rank_recorded(job: Job) -> None:
    assert [t["rank"] for t in job.truth] == list(range(RANKS))
    assert all(t["world_size"] == RANKS and t["job"] == "torchmon-e2e" for t in job.truth)
    total_samples = sum(t["samples_seen"] for t in job.truth)
    (result,) = job.query("sum(trainer_train_samples_seen_max)")
    assert float(result["value"][1]) == total_samples, (
        job.query("trainer_train_samples_seen_max"),
        job.query("timestamp(trainer_train_samples_seen_max)"),
        job.finished,
    )
    # Per rank too, and the series carry the rank labels serve() put on them
    # (the job label renamed exported_job by Prometheus, as docs/guide.md says).
    per_rank = job.query("trainer_train_samples_seen_max")
    assert {
        item["metric"]["rank"]: (
            float(item["value"][1]),
            item["metric"]["exported_job"],
            item["metric"]["node"],
        )
        for item in per_rank
    } == {str(t["rank"]): (float(t["samples_seen"]), "torchmon-e2e", "0") for t in job.truth}


def test_the_histogram_counts_every_step_of_every_rank(job: Job) -> None:
    if not hasattr(torchmon.Aggregation, "P99"):
        pytest.skip("this torchmon has no P aggregations, so no histogram export")
    steps = sum(len(t["step_times"]) for t in job.truth)
    assert steps == RANKS * 150
    (result,) = job.query("sum(trainer_train_step_time_seconds_histogram_count)")
    assert float(result["value"][1]) == steps


def test_max_by_rank_shows_every_rank(job: Job) -> None:
    result = job.query("max by (rank) (trainer_train_step_time_seconds_max)")
    assert sorted(values_by(result, "rank")) == [str(rank) for rank in range(RANKS)]
    # Each is that rank's slowest step of its last window: one of its samples.
    for rank, value in values_by(result, "rank").items():
        assert value in job.truth[int(rank)]["step_times"]
    (slowest,) = job.query("topk(1, max by (rank) (trainer_train_step_time_seconds_max))")
    assert float(slowest["value"][1]) == max(values_by(result, "rank").values())


def test_p99_across_ranks_is_within_the_histogram_error(job: Job) -> None:
    if not hasattr(torchmon.Aggregation, "P99"):
        pytest.skip(
            "this torchmon has no P aggregations (Aggregation.P99), so the example's "
            "step time has no Prometheus histogram to take histogram_quantile of"
        )
    samples = sorted(x for t in job.truth for x in t["step_times"])
    exact_p99 = samples[max(1, math.ceil(99 * len(samples) / 100)) - 1]
    (result,) = job.query(
        "histogram_quantile(0.99, sum by (le) (trainer_train_step_time_seconds_histogram_bucket))"
    )
    estimate = float(result["value"][1])
    # histogram_quantile interpolates inside the bucket that holds the exact
    # p99 (both rank by the same cumulative counts), whose bounds are a factor
    # 2**(1/4) apart with the default 4 buckets per octave (docs/sinks.md).
    ratio = 2 ** (1 / 4)
    assert exact_p99 / ratio <= estimate <= exact_p99 * ratio, (estimate, exact_p99)
