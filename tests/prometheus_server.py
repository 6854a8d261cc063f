"""A real Prometheus server in a child process, scraping given targets every
second, for the tests that query what it aggregated
(tests/user/test_torchrun_prometheus.py, tests/sinks/test_prometheus_cross_rank.py).

Two versions (docs/compatibility.md, "Tested servers"): bookworm's 2.42 (the
``prometheus`` package, installed by .ci/run) and sid's 3.5 (extracted into
target/sid by .ci/debian-sid-debs, which .ci/run calls). ``PROMETHEUS_VERSIONS``
parametrizes a test's fixture over both; each skips, saying how to get it, when
its binary is absent, and fails instead when ``TORCHMON_REQUIRE_SERVERS=1`` (as
.ci/run sets), so that CI cannot pass by skipping them."""

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

REPO = Path(__file__).resolve().parents[1]
# target/sid holds the packages .ci/debian-sid-debs extracted.
SID = Path(os.environ.get("TORCHMON_SID_ROOT") or REPO / "target" / "sid")


def _existing(*paths: str | Path | None) -> str | None:
    return next((str(p) for p in paths if p and os.path.exists(p)), None)


PROMETHEUS = _existing(
    os.environ.get("TORCHMON_PROMETHEUS2"), shutil.which("prometheus"), "/usr/bin/prometheus"
)
SKIP_REASON = "no prometheus binary (Debian: apt-get install prometheus; .ci/run does)"
PROMETHEUS3 = _existing(os.environ.get("TORCHMON_PROMETHEUS3"), SID / "usr/bin/prometheus")
SKIP_REASON3 = (
    "no Prometheus 3 binary (.ci/debian-sid-debs prometheus extracts sid's into "
    "target/sid; TORCHMON_PROMETHEUS3=/path/to/prometheus names another)"
)
# The versions a test's fixture runs against, as pytest ids; server_binary()
# says which binary each is.
PROMETHEUS_VERSIONS = ("prometheus2", "prometheus3")


def require_or_skip(reason: str) -> None:
    """Skips with ``reason``, or fails when ``TORCHMON_REQUIRE_SERVERS=1``:
    CI has fetched every server, so a missing one there is a broken step."""
    if os.environ.get("TORCHMON_REQUIRE_SERVERS") == "1":
        pytest.fail(f"TORCHMON_REQUIRE_SERVERS=1 but {reason}")
    pytest.skip(reason)


def server_binary(version: str) -> str:
    """The binary of one of ``PROMETHEUS_VERSIONS``, or a skip saying how to get it."""
    path, reason = {
        "prometheus2": (PROMETHEUS, SKIP_REASON),
        "prometheus3": (PROMETHEUS3, SKIP_REASON3),
    }[version]
    if path is None:
        require_or_skip(reason)
    assert path is not None
    return path


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
    (docs/sinks.md, "Native histograms"). ``binary``: which Prometheus (by
    default bookworm's, ``PROMETHEUS``); ``features``: more feature flags."""

    def __init__(
        self,
        tmp: Path,
        targets: list[str],
        job: str = "torchrun",
        *,
        native_histograms: bool = False,
        scrape_interval: str = "1s",
        binary: str | None = None,
        features: tuple[str, ...] = (),
    ) -> None:
        if binary is None:
            binary = server_binary("prometheus2")
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
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *(["--enable-feature=native-histograms"] if native_histograms else []),
                *(f"--enable-feature={feature}" for feature in features),
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
