"""What one Prometheus scrape of a rank costs, and what it does to the training loop.

Run (after ``maturin develop --release``):

    .venv/bin/python benches/bench_prometheus_scrape.py [--repeats 15] [--loop-seconds 3]

Part 1, per scrape, in this process: the CPU time (``time.thread_time`` of
the rendering thread, median and minimum of ``--repeats``) and the bytes of
a ``PrometheusEventHandler.serve()`` handler holding 200 and 1,000
distribution Stats (P50, P99 and the histogram, one window of 500 samples
each): the classic text exposition and the protobuf one with native
histograms, both rendered in Rust detached from Python, and the same
state's text through prometheus_client's ``generate_latest`` (as before);
against prometheus_client's text scrape of 200 ``Histogram``s with their
15 default buckets, and ``math.fabs(1.5)``, all in the same run.

Part 2, the loop: the longest gap between two consecutive ``Stat.add``
calls of a hot loop (1 ms windows, so that windows close into the handler)
over ``--loop-seconds`` (``--loop-repeats`` times), unscraped, then while a scraper *process* GETs
``/metrics`` every 100 ms: from ``serve()``'s Rust server as Prometheus with
native histograms asks (protobuf) and as a text scraper, and, for the
before figure, from a Python WSGI thread rendering prometheus_client's text
of the same registry. The handler serves 200 distribution Stats.
docs/performance.md ("Prometheus scrapes") has the figures.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
import sys
import time
from datetime import timedelta

from prometheus_client import CollectorRegistry, Histogram, generate_latest

import torchmon

PROTOBUF_ACCEPT = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3"
)
AGGREGATIONS = [torchmon.Aggregation.P50, torchmon.Aggregation.P99]


def handler_with(stats: int, samples: int = 500) -> torchmon.PrometheusEventHandler:
    # serve()'s own registry: the text is rendered in Rust, and a Rust thread serves.
    sink = torchmon.PrometheusEventHandler.serve(port_base=0, labels={"rank": "0"})
    handle = torchmon.register_event_handler(sink)
    rng = random.Random(stats)
    try:
        for index in range(stats):
            stat = torchmon.Stat(f"layer{index}.grad_norm", AGGREGATIONS, timedelta(hours=1))
            stat.add_many([rng.lognormvariate(0.0, 2.0) for _ in range(samples)])
            del stat  # emits its window
    finally:
        torchmon.unregister_event_handler(handle)
    return sink


def cpu_per_call(render, repeats: int) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """(median, min) thread CPU seconds of one render, and its bytes."""
    size = len(render())
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        render()
        times.append(time.thread_time() - start)
    return statistics.median(times), min(times), size


def fabs_seconds(repeats: int) -> float:
    best = math.inf
    fabs = math.fabs
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(100_000):
            fabs(1.5)
        best = min(best, (time.perf_counter() - start) / 100_000)
    return best


def part_one(repeats: int) -> None:
    peer_registry = CollectorRegistry()
    rng = random.Random(0)
    for index in range(200):
        histogram = Histogram(f"peer{index}_seconds", "peer", registry=peer_registry)
        for _ in range(500):
            histogram.observe(rng.lognormvariate(0.0, 2.0))
    peer = cpu_per_call(lambda: generate_latest(peer_registry), repeats)
    fabs = fabs_seconds(repeats)
    print(f"math.fabs(1.5): {fabs * 1e9:.1f} ns")
    print("| scrape | CPU ms median | CPU ms min | bytes | CPU vs prometheus_client (median) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(
        f"| prometheus_client text, 200 default Histograms | {peer[0] * 1e3:.2f} | "
        f"{peer[1] * 1e3:.2f} | {peer[2]:,} | 1 |"
    )
    for stats in (200, 1000):
        sink = handler_with(stats)
        for label, accept in (
            ("text, prometheus_client (before)", None),
            ("text, Rust", "text/plain"),
            ("protobuf, Rust", PROTOBUF_ACCEPT),
        ):

            def render(
                accept: str | None = accept, sink: torchmon.PrometheusEventHandler = sink
            ) -> bytes:
                if accept is None:  # the same state through the registry, as before
                    return generate_latest(sink.registry)
                rendered = sink.render(accept)
                assert rendered is not None
                return rendered[1]

            median, best, size = cpu_per_call(
                render, repeats if stats == 200 else max(3, repeats // 3)
            )
            print(
                f"| torchmon {label}, {stats} distribution Stats | {median * 1e3:.2f} | "
                f"{best * 1e3:.2f} | {size:,} | {peer[0] / median:.1f} × cheaper |"
                if median < peer[0]
                else f"| torchmon {label}, {stats} distribution Stats | {median * 1e3:.2f} | "
                f"{best * 1e3:.2f} | {size:,} | {median / peer[0]:.1f} × dearer |"
            )
        sink.close()


SCRAPER = """
import sys, time, urllib.request
port, accept, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
end = time.monotonic() + seconds
scrapes = 0
while time.monotonic() < end:
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    scrapes += 1
    time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))
print(scrapes)
"""


def longest_gap(seconds: float) -> float:
    stat = torchmon.Stat("hot.loop", [torchmon.Aggregation.MEAN], timedelta(milliseconds=1))
    add = stat.add
    clock = time.perf_counter
    worst = 0.0
    previous = clock()
    end = previous + seconds
    while True:
        add(1.0)
        now = clock()
        if now - previous > worst:
            worst = now - previous
        previous = now
        if now > end:
            return worst


def python_text_app(sink: torchmon.PrometheusEventHandler):  # type: ignore[no-untyped-def]
    """Before: a Python WSGI thread rendering prometheus_client's text."""

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        body = generate_latest(sink.registry)
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]

    return app


def part_two(seconds: float, repeats: int) -> None:
    sink = handler_with(200)
    sink_handle = torchmon.register_event_handler(sink)
    from torchmon.handlers.prometheus import _start_server

    httpd, thread = _start_server("127.0.0.1", 0, python_text_app(sink))
    python_port = int(httpd.server_port)
    rust_port = sink.port
    assert rust_port is not None
    try:
        # Each loop repeated; the minimum and median of the repeats' longest
        # gaps, so that one hiccup of a loaded machine is not the figure.
        rows = [("unscraped", [longest_gap(seconds) for _ in range(repeats)], 0)]
        for label, accept, port in (
            ("protobuf, Rust server", PROTOBUF_ACCEPT, rust_port),
            ("text, Rust server", "text/plain", rust_port),
            ("text, Python server + prometheus_client (before)", "text/plain", python_port),
        ):
            gaps = []
            scrapes = 0
            for _ in range(repeats):
                scraper = subprocess.Popen(
                    [sys.executable, "-c", SCRAPER, str(port), accept, str(seconds + 1.0)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                time.sleep(0.5)  # the scraper is running
                gaps.append(longest_gap(seconds))
                out, _ = scraper.communicate(timeout=seconds + 60)
                scrapes += int(out.strip() or 0)
            rows.append((f"scraped every 100 ms, {label}", gaps, scrapes))
        print("| loop | longest gap ms, min of repeats | median | scrapes |")
        print("| --- | ---: | ---: | ---: |")
        for label, gaps, scrapes in rows:
            print(
                f"| {label} | {min(gaps) * 1e3:.2f} | {statistics.median(gaps) * 1e3:.2f} "
                f"| {scrapes} |"
            )
    finally:
        torchmon.unregister_event_handler(sink_handle)
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
        sink.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--loop-seconds", type=float, default=3.0)
    parser.add_argument("--loop-repeats", type=int, default=3)
    args = parser.parse_args()
    from importlib.metadata import version

    print(f"prometheus_client {version('prometheus-client')}, torchmon {torchmon.__version__}")
    part_one(args.repeats)
    part_two(args.loop_seconds, args.loop_repeats)


if __name__ == "__main__":
    main()
