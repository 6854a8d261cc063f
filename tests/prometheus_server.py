"""A real Prometheus server (Debian's ``prometheus``, installed by .ci/run) in a
child process, scraping given targets every second, for the tests that query
what it aggregated (tests/user/test_torchrun_prometheus.py,
tests/sinks/test_prometheus_cross_rank.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None
)
SKIP_REASON = "no prometheus binary (Debian: apt-get install prometheus; .ci/run does)"
# Deadlines, not assertions about speed: how long to wait before giving up.
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
    """Signals the process group of ``proc`` (started as a session leader),
    waits, then kills the group."""
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


def http_get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode("utf-8"))


class PrometheusServer:
    """``with PrometheusServer(tmp, targets) as server:`` a server on
    127.0.0.1 with its own TSDB under ``tmp``, scraping ``targets``
    (``host:port``) as job ``job`` every second; stopped by pid on leaving.
    ``native_histograms``: with the feature flag that makes Prometheus 2.x
    ask for the protobuf format and ingest native histograms
    (docs/sinks.md, "Native histograms")."""

    def __init__(
        self,
        tmp: Path,
        targets: list[str],
        job: str = "torchrun",
        *,
        native_histograms: bool = False,
        scrape_interval: str = "1s",
    ) -> None:
        if PROMETHEUS is None:
            pytest.skip(SKIP_REASON)
        self.job = job
        self.targets = targets
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  scrape_timeout: {scrape_interval}\n"
            "scrape_configs:\n"
            f"  - job_name: {job}\n"
            "    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n",
            encoding="utf-8",
        )
        port = free_port()
        self.api = f"http://127.0.0.1:{port}"
        self.log_path = tmp / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *(["--enable-feature=native-histograms"] if native_histograms else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        stop_group(self.proc)
        self._log.close()

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result vector of an instant query at the server's now."""
        url = f"{self.api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        reply = http_get_json(url)
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])

    def wait_for_scrapes_after(self, when: float) -> None:
        """Until every target was scraped, successfully, at a time after
        ``when`` (seconds since the epoch)."""
        deadline = time.monotonic() + SCRAPE_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"prometheus exited {self.proc.returncode}: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            try:
                # timestamp() of a bare selector is the scrape's time (of an
                # expression such as `up == 1`, the query's): ask for both apart.
                scrapes = self.query(f'timestamp(up{{job="{self.job}"}})')
                up = self.query(f'up{{job="{self.job}"}}')
            except OSError:  # not listening yet
                scrapes, up = [], []
            if (
                len(scrapes) == len(self.targets)
                and min(float(s["value"][1]) for s in scrapes) > when
                and [float(u["value"][1]) for u in up] == [1.0] * len(self.targets)
            ):
                return
            if time.monotonic() > deadline:
                targets = http_get_json(self.api + "/api/v1/targets") if scrapes else None
                pytest.fail(f"Prometheus did not scrape every target after {when}: {targets}")
            time.sleep(0.25)
