""".ci/debian-sid-debs (docs/compatibility.md, "Tested servers") when a
package cannot be fetched: one line on stderr naming it and a failing exit,
never a hang, with a mirror that refuses connections and with one that
accepts them and never answers. Its own target directory under tmp; run
from a checkout only (.ci/ is not in the wheel's test copy)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_server import free_port

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "debian-sid-debs"
# A deadline for the script, well above its own timeout: not a speed check.
RUN_TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def _checkout() -> None:
    if not SCRIPT.is_file():
        pytest.skip("not run from a checkout (.ci/debian-sid-debs is absent)")
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("no apt-get/dpkg-deb (not Debian)")


def run(tmp_path: Path, mirror: str, net_timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "prometheus", "victoria-metrics"],
        env={
            **os.environ,
            "TORCHMON_SID_TARGET": str(tmp_path / "target"),
            "TORCHMON_DEBIAN_MIRROR": mirror,
            "TORCHMON_SID_TIMEOUT": str(net_timeout),
        },
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def assert_one_line_naming_the_packages(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("debian-sid-debs: cannot fetch prometheus victoria-metrics:")


def test_a_refusing_mirror_fails_at_once_with_one_line(tmp_path: Path) -> None:
    result = run(tmp_path, f"http://127.0.0.1:{free_port()}/debian", net_timeout=30)
    assert_one_line_naming_the_packages(result)
    assert not (tmp_path / "target" / "sid" / "usr").exists()


def test_a_silent_mirror_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # accepted by the kernel, never answered
        port = listener.getsockname()[1]
        started = time.monotonic()
        result = run(tmp_path, f"http://127.0.0.1:{port}/debian", net_timeout=3)
        print(f"gave up after {time.monotonic() - started:.1f} s")
    assert_one_line_naming_the_packages(result)
    assert "timed out after 3 s" in result.stderr
