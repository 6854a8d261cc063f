"""Native histograms end to end (docs/sinks.md, "Native histograms"): N light
rank processes (tests/prometheus_light_rank.py; N from
``TORCHMON_NATIVE_RANKS``, 8 by default, as .ci/run runs it) under real
torchrun, each serving 3 distribution Stats, one all negative and one mostly
negative, scraped by Debian's Prometheus with native histograms enabled and
queried over its HTTP API. Both process trees are stopped by pid, with
timeouts, whatever happens."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
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

RANK_SCRIPT = Path(__file__).resolve().parents[1] / "prometheus_light_rank.py"
RANKS = int(os.environ.get("TORCHMON_NATIVE_RANKS", "8"))
STATS = ("reward", "loss_delta", "latency2")
START_TIMEOUT = 60.0  # a deadline for the ranks to start and record, not a speed check


def kill_group_of(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Job:
    query: Callable[[str], list[dict[str, Any]]]
    samples: dict[str, list[float]]  # every rank's samples, by Stat
    seconds: float
    version: str  # one of prometheus_server.PROMETHEUS_VERSIONS
    started: float  # time.time() before the ranks started


# Each test runs against both Prometheus versions (tests/prometheus_server.py),
# one job per version.
@pytest.fixture(scope="module", params=PROMETHEUS_VERSIONS)
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    binary = server_binary(request.param)
    started = time.monotonic()
    wall_start = time.time()
    tmp = tmp_path_factory.mktemp("torchrun_native")
    port_base = free_port_run(RANKS)
    targets = [f"127.0.0.1:{port_base + rank}" for rank in range(RANKS)]
    log_path = tmp / "torchrun.log"
    truth_dir = tmp / "truth"
    # An ExitStack, not a parenthesised with: the tests also run on Python 3.9.
    with contextlib.ExitStack() as stack:
        # 3.x also ingests each histogram's created_timestamp as a zero
        # sample (docs/sinks.md, "Prometheus 3"); 2.42 has no such feature.
        features = ("created-timestamp-zero-ingestion",) if request.param == "prometheus3" else ()
        server = stack.enter_context(
            PrometheusServer(tmp, targets, native_histograms=True, binary=binary, features=features)
        )
        log = stack.enter_context(log_path.open("wb"))
        torchrun: subprocess.Popen[bytes] | None = None
        try:
            torchrun = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nproc-per-node={RANKS}",
                    "--master-addr=127.0.0.1",
                    f"--master-port={free_port()}",
                    "--rdzv-id=torchmon-native",
                    str(RANK_SCRIPT),
                    f"--port-base={port_base}",
                    f"--stats={len(STATS)}",
                    "--negative",
                    f"--truth={truth_dir}",
                ],
                cwd=tmp,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            paths = [truth_dir / f"rank{rank}.json" for rank in range(RANKS)]
            deadline = time.monotonic() + START_TIMEOUT
            while not all(path.exists() for path in paths):
                tail = log_path.read_text(errors="replace")[-3000:]
                if torchrun.poll() is not None:
                    pytest.fail(f"torchrun exited {torchrun.returncode} early:\n{tail}")
                if time.monotonic() > deadline:
                    pytest.fail(f"the ranks did not record in {START_TIMEOUT} s:\n{tail}")
                time.sleep(0.2)
            finished = max(path.stat().st_mtime for path in paths)
            samples: dict[str, list[float]] = {name: [] for name in STATS}
            for path in paths:
                for name, values in json.loads(path.read_text())["samples"].items():
                    samples[name] += values
            server.wait_for_scrapes_after(finished)
            yield Job(server.query, samples, time.monotonic() - started, request.param, wall_start)
        finally:
            pids = [
                int(p) for p in re.findall(r"\(pid (\d+)\)", log_path.read_text(errors="replace"))
            ]
            if torchrun is not None:
                stop_group(torchrun)
            for pid in pids:
                kill_group_of(pid)


def value(result: list[dict[str, Any]]) -> float:
    (item,) = result
    return float(item["value"][1])


def test_one_series_per_distribution_per_rank(job: Job) -> None:
    print(f"{RANKS} ranks ready and scraped in {job.seconds:.1f} s")
    for name in STATS:
        series = job.query(f'{{__name__=~"{name}_histogram.*"}}')
        assert sorted(item["metric"]["rank"] for item in series) == sorted(
            str(rank) for rank in range(RANKS)
        )
        assert {item["metric"]["__name__"] for item in series} == {f"{name}_histogram"}
        # Native: the series' value is a histogram, not a float.
        assert all("histogram" in item for item in series), series[0]


def test_counts_and_sums_across_ranks_equal_what_was_recorded(job: Job) -> None:
    for name in STATS:
        samples = job.samples[name]
        count = value(job.query(f"histogram_count(sum({name}_histogram))"))
        total = value(job.query(f"histogram_sum(sum({name}_histogram))"))
        assert count == len(samples) == RANKS * 600
        assert math.isclose(total, math.fsum(samples), rel_tol=1e-9, abs_tol=1e-9), name


def test_cross_rank_p99_is_within_two_percent_of_exact(job: Job) -> None:
    assert all(x < 0 for x in job.samples["loss_delta"])
    assert sum(x < 0 for x in job.samples["reward"]) > len(job.samples["reward"]) / 2
    for name in STATS:
        for q in (0.99, 0.5, 0.01):
            ordered = sorted(job.samples[name])
            exact = ordered[max(1, math.ceil(q * len(ordered))) - 1]
            estimate = value(job.query(f"histogram_quantile({q}, sum({name}_histogram))"))
            print(f"{name} q{q}: exact {exact!r}, Prometheus {estimate!r}")
            assert abs(estimate - exact) <= 0.02 * abs(exact), (name, q, estimate, exact)


def test_histograms_start_at_their_created_timestamp_on_prometheus_3(job: Job) -> None:
    # torchmon's protobuf body carries each histogram's created_timestamp
    # (when its first window arrived); 3.x with
    # created-timestamp-zero-ingestion stores a zero sample there, before the
    # first scrape's, so that rate() and increase() count the first window
    # too. 2.42 has no such feature: its first sample is the first scrape's.
    for name in STATS:
        series = job.query(f"{name}_histogram[10m]")
        assert len(series) == RANKS
        for item in series:
            (when, first), *rest = item["histograms"]
            if job.version == "prometheus3":
                assert float(first["count"]) == 0, (name, item["metric"], first)
                assert rest, item["metric"]
                assert job.started <= float(when) < float(rest[0][0]), (name, when)
            else:
                assert float(first["count"]) > 0, (name, item["metric"], first)
