"""One Prometheus server scraping many ranks: native histograms against classic.

Run (after ``maturin develop --release``; needs Debian's ``prometheus``):

    .venv/bin/python benches/bench_prometheus_ranks.py --ranks 64 256 [--seconds 40]

For each rank count N: N light rank processes (tests/prometheus_light_rank.py,
no torch; each 200 distribution Stats with MEAN, P50 and P99, serving
``PrometheusEventHandler.serve()`` on its own port with torchrun's rank
environment) are started; then, one after the other, a Prometheus 2.x server
with ``--enable-feature=native-histograms`` (it scrapes protobuf: native
histograms) and one without (it scrapes text: classic buckets), each
scraping all N every 1 s for ``--seconds``. Printed per server: the head
series (``prometheus_tsdb_head_series``), its resident memory, the
per-target scrape duration (mean and max of ``scrape_duration_seconds``) and
how many targets were up at the end. docs/performance.md ("Prometheus
scrapes") has the figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path.insert(0, str(TESTS))

from prometheus_server import PrometheusServer, free_port_run  # noqa: E402

RANK_SCRIPT = TESTS / "prometheus_light_rank.py"


def self_metric(server: PrometheusServer, name: str) -> float:
    with urllib.request.urlopen(server.api + "/metrics", timeout=120) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return math_nan()


def math_nan() -> float:
    return float("nan")


def start_ranks(count: int, port_base: int) -> list[subprocess.Popen[bytes]]:
    ranks = []
    for rank in range(count):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(count),
            "LOCAL_WORLD_SIZE": str(count),
            "GROUP_RANK": "0",
            "TORCHELASTIC_RUN_ID": "bench",
        }
        ranks.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(RANK_SCRIPT),
                    f"--port-base={port_base}",
                    "--stats=200",
                    "--samples=50",
                    "--windows=1",
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    return ranks


def wait_serving(ranks: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc in ranks:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "rank R (pid P) serving on port N"
        if b"serving" not in line:
            raise SystemExit(f"a rank failed: {line!r} {proc.stdout.read()[-2000:]!r}")
        if time.monotonic() > deadline:
            raise SystemExit("the ranks did not start in time")


def measure(tmp: Path, targets: list[str], native: bool, seconds: float) -> dict[str, float]:
    job = "native" if native else "classic"
    (tmp / job).mkdir()
    with PrometheusServer(tmp / job, targets, job=job, native_histograms=native) as server:
        time.sleep(seconds)
        durations = [
            float(r["value"][1]) for r in server.query(f'scrape_duration_seconds{{job="{job}"}}')
        ]
        up = server.query(f'sum(up{{job="{job}"}})')
        samples = server.query(f'sum(scrape_samples_scraped{{job="{job}"}})')
        return {
            "head_series": self_metric(server, "prometheus_tsdb_head_series"),
            "rss_mb": self_metric(server, "process_resident_memory_bytes") / 2**20,
            "scrape_mean_ms": 1e3 * sum(durations) / max(1, len(durations)),
            "scrape_max_ms": 1e3 * max(durations, default=math_nan()),
            "up": float(up[0]["value"][1]) if up else 0.0,
            "samples_per_scrape": float(samples[0]["value"][1]) if samples else 0.0,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    print(
        "| ranks | server | head series | RSS MiB | scrape mean ms | scrape max ms | up "
        "| samples/scrape |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for count in args.ranks:
        port_base = free_port_run(count)
        ranks = start_ranks(count, port_base)
        try:
            wait_serving(ranks, timeout=600)
            targets = [f"127.0.0.1:{port_base + rank}" for rank in range(count)]
            with tempfile.TemporaryDirectory() as tmp:
                for native in (True, False):
                    r = measure(Path(tmp), targets, native, args.seconds)
                    kind = "native" if native else "classic"
                    print(
                        f"| {count} | {kind} | {r['head_series']:,.0f} | {r['rss_mb']:,.0f} "
                        f"| {r['scrape_mean_ms']:.1f} | {r['scrape_max_ms']:.1f} "
                        f"| {r['up']:.0f} | {r['samples_per_scrape']:,.0f} |",
                        flush=True,
                    )
        finally:
            for proc in ranks:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in ranks:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=20)


if __name__ == "__main__":
    main()
