"""OTLP push into a real VictoriaMetrics (sid's, tests/victoriametrics_server.py;
docs/sinks.md, "OTLP into VictoriaMetrics"): two jobs of 2 rank processes
each (tests/otlp_rank.py, rank labels from torchrun's variables) push one
Stat with P50/P99 with ``OpenTelemetryEventHandler.otlp``, exporting after
each of 6 windows whose spread grows. VictoriaMetrics stores each bucket of
an exponential histogram as a series of its own (label ``vmrange``, the
bucket's bounds). Job ``default`` (the handler's default, at most 160
buckets) lowers its scale as the range grows, so the series of the earlier,
finer buckets keep their last counts beside the coarser ones, overlapping
them: a p99 summed over the buckets is off by several percent. Job
``fixed`` (``scale=6``) keeps every bucket's bounds: its p99 is within 2% of
exact. Counts are exact in both. All the processes are stopped by pid."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import stop_group
from support import TORCHRUN_VARIABLES
from victoriametrics_server import VictoriaMetricsServer

pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    reason="the OTLP/HTTP exporter (the otlp extra) is not installed",
)

RANK_SCRIPT = Path(__file__).resolve().parents[1] / "otlp_rank.py"
RANKS = 2
WINDOWS, SAMPLES = 6, 500  # per rank: 6 windows of 500 samples
JOBS = {"default": None, "fixed": 6}  # job -> the handler's scale
# Deadlines, not speed checks.
RANK_TIMEOUT = 60.0
INGEST_TIMEOUT = 20.0
# The documented query (docs/sinks.md): every bucket series' last count,
# summed by bucket across ranks.
P99 = (
    "histogram_quantile(0.99, sum(last_over_time("
    '{{__name__="step.latency_bucket",job="{job}"}}[1h])) by (vmrange))'
)
COUNT = 'sum(last_over_time({{__name__="step.latency_count",job="{job}"}}[1h]))'


@dataclass
class Pushed:
    vm: VictoriaMetricsServer
    samples: dict[str, list[float]]  # job -> every rank's samples


def value(result: list[dict[str, Any]]) -> float:
    (item,) = result
    return float(item["value"][1])


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    tmp = tmp_path_factory.mktemp("otlp_vm")
    with VictoriaMetricsServer(tmp) as vm:
        base = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
        ranks: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            for job, scale in JOBS.items():
                for rank in range(RANKS):
                    log = tmp / f"{job}-rank{rank}.log"
                    with log.open("wb") as out:
                        proc = subprocess.Popen(
                            [
                                sys.executable,
                                str(RANK_SCRIPT),
                                f"--endpoint={vm.otlp}",
                                f"--truth={tmp / job}",
                                f"--windows={WINDOWS}",
                                f"--samples={SAMPLES}",
                                *([] if scale is None else [f"--scale={scale}"]),
                            ],
                            env={
                                **base,
                                "RANK": str(rank),
                                "LOCAL_RANK": str(rank),
                                "WORLD_SIZE": str(RANKS),
                                "GROUP_RANK": "0",
                                "TORCHELASTIC_RUN_ID": job,
                            },
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    ranks.append((proc, log))
            deadline = time.monotonic() + RANK_TIMEOUT
            for proc, log in ranks:
                try:
                    code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pytest.fail(f"a rank did not finish in {RANK_TIMEOUT} s: {log.read_text()}")
                assert code == 0, log.read_text(errors="replace")[-3000:]
            samples = {
                job: [
                    x
                    for rank in range(RANKS)
                    for x in json.loads((tmp / job / f"rank{rank}.json").read_text())["samples"]
                ]
                for job in JOBS
            }
            # Until the last export of every rank is searchable.
            deadline = time.monotonic() + INGEST_TIMEOUT
            while not all(
                [float(r["value"][1]) for r in vm.query(COUNT.format(job=job))]
                == [len(samples[job])]
                for job in JOBS
            ):
                if time.monotonic() > deadline:
                    counts = {job: vm.query(COUNT.format(job=job)) for job in JOBS}
                    pytest.fail(f"VictoriaMetrics' counts after {INGEST_TIMEOUT} s: {counts}")
                time.sleep(0.2)
            yield Pushed(vm, samples)
        finally:
            for proc, _ in ranks:
                stop_group(proc)


def exact_p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(0.99 * len(ordered))) - 1]


def vmranges(pushed: Pushed, job: str, rank: int) -> list[tuple[float, float]]:
    result = pushed.vm.query(
        f'last_over_time({{__name__="step.latency_bucket",job="{job}",rank="{rank}"}}[1h])'
    )
    bounds = [item["metric"]["vmrange"].split("...") for item in result]
    return sorted((float(low), float(high)) for low, high in bounds)


def overlapping(ranges: list[tuple[float, float]]) -> bool:
    # Sorted by lower bound: neighbours at one scale share a bound exactly.
    return any(b[0] < a[1] for a, b in zip(ranges, ranges[1:]))


def test_counts_are_exact_and_labels_kept(pushed: Pushed) -> None:
    for job in JOBS:
        assert value(pushed.vm.query(COUNT.format(job=job))) == RANKS * WINDOWS * SAMPLES
        per_rank = pushed.vm.query(f'{{__name__="step.latency_count",job="{job}"}}')
        # Dotted names kept; the rank's attributes and the resource's as labels.
        assert sorted(item["metric"]["rank"] for item in per_rank) == ["0", "1"]
        assert {item["metric"]["service.name"] for item in per_rank} == {"torchmon"}


def test_a_fixed_scale_gives_the_p99_within_two_percent(pushed: Pushed) -> None:
    exact = exact_p99(pushed.samples["fixed"])
    estimate = value(pushed.vm.query(P99.format(job="fixed")))
    print(f"fixed scale 6: p99 exact {exact!r}, VictoriaMetrics {estimate!r}")
    assert abs(estimate - exact) <= 0.02 * exact, (estimate, exact)
    for rank in range(RANKS):
        assert not overlapping(vmranges(pushed, "fixed", rank))


def test_the_default_scale_changes_between_exports(pushed: Pushed) -> None:
    # Why the default needs the setting above: buckets of several scales,
    # overlapping, each keeping the count of its last export.
    for rank in range(RANKS):
        assert overlapping(vmranges(pushed, "default", rank))
    exact = exact_p99(pushed.samples["default"])
    estimate = value(pushed.vm.query(P99.format(job="default")))
    print(f"default: p99 exact {exact!r}, VictoriaMetrics {estimate!r}")
