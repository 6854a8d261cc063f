"""A real VictoriaMetrics single-node server (sid's ``victoria-metrics``
package, extracted into target/sid by .ci/debian-sid-debs, which .ci/run
calls) in a child process on 127.0.0.1 with its own storage, for
tests/sinks/test_otlp_victoriametrics.py. Skips, saying how to get it, when
the binary is absent; fails instead under ``TORCHMON_REQUIRE_SERVERS=1``
(tests/prometheus_server.py)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import SID, free_port, http_get_json, require_or_skip, stop_group

VICTORIA_METRICS = next(
    (
        str(p)
        for p in (os.environ.get("TORCHMON_VICTORIA_METRICS"), SID / "usr/bin/victoria-metrics")
        if p and os.path.exists(p)
    ),
    None,
)
SKIP_REASON = (
    "no victoria-metrics binary (.ci/debian-sid-debs victoria-metrics extracts sid's into "
    "target/sid; TORCHMON_VICTORIA_METRICS=/path/to/victoria-metrics names another)"
)
START_TIMEOUT = 20.0  # a deadline for the server to answer, not a speed check


class VictoriaMetricsServer:
    """``with VictoriaMetricsServer(tmp) as vm:`` a server whose OTLP/HTTP
    metrics URL is ``vm.otlp``, queried with ``vm.query``; stopped by pid."""

    def __init__(self, tmp: Path) -> None:
        if VICTORIA_METRICS is None:
            require_or_skip(SKIP_REASON)
        assert VICTORIA_METRICS is not None
        port = free_port()
        self.api = f"http://127.0.0.1:{port}"
        self.otlp = f"{self.api}/opentelemetry/v1/metrics"
        self.log_path = tmp / "victoria-metrics.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                VICTORIA_METRICS,
                f"-storageDataPath={tmp / 'vm-data'}",
                f"-httpListenAddr=127.0.0.1:{port}",
                # Queries see samples at once: by default the last 30 s are
                # hidden from them (samples may still be arriving).
                "-search.latencyOffset=0s",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"victoria-metrics exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.api + "/health", timeout=2) as response:
                    if response.read().strip() == b"OK":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"victoria-metrics did not answer in {START_TIMEOUT} s")
            time.sleep(0.1)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def __enter__(self) -> VictoriaMetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        stop_group(self.proc)
        self._log.close()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The result vector of an instant query at the server's now."""
        url = f"{self.api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        reply = http_get_json(url)
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])
