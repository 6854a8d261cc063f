"""One rank of a multi-node job exposing its torchmon Stats to Prometheus.

Run:  RANK=0 python examples/multinode_prometheus.py [--rank R] [--job NAME] [--port P]

Every rank serves its own /metrics endpoint (one port per rank; here
127.0.0.1 and, by default, a free port) and puts constant ``rank`` and
``job`` labels on every gauge, so that Prometheus, scraping all ranks, can
tell the series apart and aggregate them (``max by (job) (trainer_train_loss_mean)``).
This script records a few 100 ms windows, scrapes its own endpoint once,
prints the torchmon gauges it found and exits.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import time
import urllib.request
from datetime import timedelta

import prometheus_client

import torchmon
from torchmon import Aggregation


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", default=os.environ.get("RANK", "0"))
    parser.add_argument("--job", default=os.environ.get("JOB_NAME", "example"))
    parser.add_argument("--port", type=int, help="default: a free port")
    args = parser.parse_args()
    port = free_port() if args.port is None else args.port

    # Its own registry keeps the scrape to torchmon's gauges; with the default
    # registry (registry=None) they are served beside the process metrics.
    registry = prometheus_client.CollectorRegistry()
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    sink = torchmon.PrometheusEventHandler(
        registry=registry, prefix="trainer_", labels={"rank": str(args.rank), "job": args.job}
    )
    handle = torchmon.register_event_handler(sink)
    try:
        loss = torchmon.Stat(
            "train.loss",
            [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT],
            timedelta(milliseconds=100),
        )
        rng = random.Random(int(args.rank))
        deadline = time.monotonic() + 0.5  # about five windows
        while time.monotonic() < deadline:
            loss.add(rng.uniform(0.5, 1.5))
            time.sleep(0.002)
        del loss  # emits the last, partial window too

        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode("utf-8")
        print(f"scraped {url}:")
        for line in text.splitlines():
            if line.startswith("trainer_"):
                print(line)
    finally:
        torchmon.unregister_event_handler(handle)
        sink.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


if __name__ == "__main__":
    main()
