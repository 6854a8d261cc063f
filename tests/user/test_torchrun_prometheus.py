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
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from prometheus_server import (
    PROMETHEUS_VERSIONS,
    PrometheusServer,
    free_port,
    free_port_run,
    server_binary,
    stop_group,
)

pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun_prometheus.py"
RANKS = 4
START_TIMEOUT = 90.0  # seconds for the ranks to start and train (a deadline, not a speed check)


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
    targets: list[str]
    # Prometheus 3 asks for UTF-8 names (escaping=allow-utf-8), and torchmon
    # keeps the Stat keys' dots for it (docs/sinks.md, "Prometheus 3").
    utf8_names: bool

    def metric(self, name: str, matchers: str = "") -> str:
        """The selector of the legacy-named metric ``name`` on this server."""
        if not self.utf8_names:
            return f"{name}{{{matchers}}}" if matchers else name
        quoted = f'"{UTF8_NAMES[name]}"'
        return f"{{{quoted}, {matchers}}}" if matchers else f"{{{quoted}}}"


# The example's metric names as Prometheus 2 stores them, and as 3.x does.
UTF8_NAMES = {
    "trainer_train_samples_seen_max": "trainer_train.samples_seen.max",
    "trainer_train_step_time_seconds_max": "trainer_train.step_time_seconds.max",
    "trainer_train_step_time_seconds_histogram_count": (
        "trainer_train.step_time_seconds_histogram_count"
    ),
    "trainer_train_step_time_seconds_histogram_bucket": (
        "trainer_train.step_time_seconds_histogram_bucket"
    ),
}


# Each test runs against both Prometheus versions (tests/prometheus_server.py),
# one job per version.
@pytest.fixture(scope="module", params=PROMETHEUS_VERSIONS)
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    binary = server_binary(request.param)
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("torchrun_prometheus")
    port_base = free_port_run(RANKS)
    targets = [f"127.0.0.1:{port_base + rank}" for rank in range(RANKS)]
    torchrun_log_path = tmp / "torchrun.log"
    with (
        PrometheusServer(tmp, targets, binary=binary) as server,
        torchrun_log_path.open("wb") as torchrun_log,
    ):
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

            def log_tail() -> str:
                return torchrun_log_path.read_text(encoding="utf-8", errors="replace")[-4000:]

            # Every rank trained, emitted its last windows and wrote what it recorded.
            truth_paths = [truth_dir / f"ground-truth-rank{rank}.json" for rank in range(RANKS)]
            deadline = time.monotonic() + START_TIMEOUT
            while not all(path.exists() for path in truth_paths):
                if torchrun.poll() is not None:
                    pytest.fail(f"torchrun exited {torchrun.returncode} early:\n{log_tail()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"the ranks did not train in {START_TIMEOUT} s:\n{log_tail()}")
                time.sleep(0.2)
            truth = [json.loads(path.read_text(encoding="utf-8")) for path in truth_paths]
            finished = max(path.stat().st_mtime for path in truth_paths)
            # Then until every rank was scraped after its last windows.
            server.wait_for_scrapes_after(finished)
            yield Job(
                server.query,
                truth,
                events_dir,
                time.monotonic() - started,
                finished,
                targets,
                utf8_names=request.param == "prometheus3",
            )
        finally:
            worker_pids = [
                int(pid)
                for pid in re.findall(
                    r"\(pid (\d+)\)",
                    torchrun_log_path.read_text(encoding="utf-8", errors="replace"),
                )
            ]
            if torchrun is not None:
                stop_group(torchrun)
            for pid in worker_pids:
                kill_group_of(pid)


def values_by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {item["metric"][label]: float(item["value"][1]) for item in result}


def test_sum_over_ranks_equals_what_every_rank_recorded(job: Job) -> None:
    assert [t["rank"] for t in job.truth] == list(range(RANKS))
    assert all(t["world_size"] == RANKS and t["job"] == "torchmon-e2e" for t in job.truth)
    total_samples = sum(t["samples_seen"] for t in job.truth)
    seen = job.metric("trainer_train_samples_seen_max")
    (result,) = job.query(f"sum({seen})")
    print(f"job ready in {job.seconds:.1f} s; samples: exact {total_samples}, {result['value'][1]}")
    assert float(result["value"][1]) == total_samples, (
        job.query(seen),
        job.query(f"timestamp({seen})"),
        job.finished,
    )
    # Per rank too, and the series carry the rank labels serve() put on them
    # (the job label renamed exported_job by Prometheus, as docs/guide.md says).
    per_rank = job.query(seen)
    assert {
        item["metric"]["rank"]: (
            float(item["value"][1]),
            item["metric"]["exported_job"],
            item["metric"]["node"],
        )
        for item in per_rank
    } == {str(t["rank"]): (float(t["samples_seen"]), "torchmon-e2e", "0") for t in job.truth}


def test_the_histogram_counts_every_step_of_every_rank(job: Job) -> None:
    steps = sum(len(t["step_times"]) for t in job.truth)
    assert steps == RANKS * 150
    (result,) = job.query(f"sum({job.metric('trainer_train_step_time_seconds_histogram_count')})")
    print(f"steps: exact {steps}, Prometheus {result['value'][1]}")
    assert float(result["value"][1]) == steps


def test_max_by_rank_shows_every_rank(job: Job) -> None:
    step_max = job.metric("trainer_train_step_time_seconds_max")
    result = job.query(f"max by (rank) ({step_max})")
    assert sorted(values_by(result, "rank")) == [str(rank) for rank in range(RANKS)]
    # Each is that rank's slowest step of its last window: one of its samples.
    for rank, value in values_by(result, "rank").items():
        assert value in job.truth[int(rank)]["step_times"]
    (slowest,) = job.query(f"topk(1, max by (rank) ({step_max}))")
    assert float(slowest["value"][1]) == max(values_by(result, "rank").values())


def test_p99_across_ranks_is_within_the_histogram_error(job: Job) -> None:
    samples = sorted(x for t in job.truth for x in t["step_times"])
    exact_p99 = samples[max(1, math.ceil(99 * len(samples) / 100)) - 1]
    buckets = job.metric("trainer_train_step_time_seconds_histogram_bucket")
    (result,) = job.query(f"histogram_quantile(0.99, sum by (le) ({buckets}))")
    estimate = float(result["value"][1])
    # docs/sinks.md ("Histograms of the P aggregations", Error): within
    # (2**(1/b) - 1)·|p99| with b = 4 buckets per octave, the default.
    print(f"p99 of {len(samples)} step times: exact {exact_p99!r}, Prometheus {estimate!r}")
    assert abs(estimate - exact_p99) <= (2 ** (1 / 4) - 1) * exact_p99, (estimate, exact_p99)


# Prometheus 3's Accept when native histograms are off: torchmon's server
# answers it with text 0.0.4, UTF-8 names (quoted where not legacy).
PROMETHEUS3_TEXT_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
# Prometheus 2.42's.
PROMETHEUS2_TEXT_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_bucket_bounds_are_found_as_the_exposition_writes_them(job: Job) -> None:
    # Prometheus 3 refuses a scrape whose Content-Type is missing or unknown,
    # and stores `le` as a float's text ("1" becomes "1.0"): torchmon writes
    # the type in full (with the escaping scheme 3.x asked for) and every
    # bound as a float, so that a query naming a bound as the exposition
    # shows it finds every rank's bucket on 2.x and 3.x.
    accept, content_type = (
        (PROMETHEUS3_TEXT_ACCEPT, "text/plain; version=0.0.4; charset=utf-8; escaping=allow-utf-8")
        if job.utf8_names
        else (PROMETHEUS2_TEXT_ACCEPT, "text/plain; version=0.0.4; charset=utf-8")
    )
    request = urllib.request.Request(f"http://{job.targets[0]}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"] == content_type
        text = response.read().decode("utf-8")
    bounds = re.findall(
        r"(?:trainer_train_step_time_seconds_histogram_bucket\{|"
        r'\{"trainer_train\.step_time_seconds_histogram_bucket",)[^}]*le="([^"]+)"',
        text,
    )
    assert "+Inf" in bounds and len(bounds) > 2, text[:2000]
    for bound in bounds:
        selector = job.metric("trainer_train_step_time_seconds_histogram_bucket", f'le="{bound}"')
        result = job.query(f"count({selector})")
        assert [float(item["value"][1]) for item in result] == [RANKS], bound
