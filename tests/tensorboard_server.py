"""A TensorBoard server in a child process, for the tests that look at what it
serves (tests/sinks/test_tensorboard_server.py, tests/user/test_demo_first_run.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

DEADLINE = 90.0  # seconds for the server to start and load the runs


def tensorboard_command() -> list[str]:
    """The ``tensorboard`` of this interpreter's environment."""
    script = Path(sys.executable).parent / "tensorboard"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "tensorboard.main"]


def data_server_installed() -> bool:
    """Whether TensorBoard's default loader is the Rust data server here."""
    try:
        from tensorboard_data_server import server_binary  # type: ignore[import-not-found]
    except ImportError:
        return False
    return server_binary() is not None


class Server:
    """``command`` (a list, or a shell command line run with ``exec`` so that
    the pid is TensorBoard's) plus ``--host 127.0.0.1 --port 0``: TensorBoard
    binds a free port and prints its address, which is read from its output."""

    def __init__(
        self,
        command: list[str] | str,
        output: Path,
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.output = output
        self._out = output.open("wb")
        where = ["--host", "127.0.0.1", "--port", "0"]
        if isinstance(command, str):
            args: Any = f"exec {command} {' '.join(where)}"
        else:
            args = [*command, *where]
        self.proc = subprocess.Popen(
            args,
            shell=isinstance(command, str),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        try:
            self.url = self._wait_for_url()
        except BaseException:
            self.stop()
            raise

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            found = re.search(r"at (http://127\.0\.0\.1:\d+/)", self.log())
            if found:
                return found.group(1)
            self.check_running()
            time.sleep(0.1)
        pytest.fail(f"tensorboard did not start within {DEADLINE} s:\n{self.log()}")

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"tensorboard exited with {self.proc.returncode}:\n{self.log()}")

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            return json.loads(response.read())

    def scalars(self, run: str) -> dict[str, list[tuple[float, int, float]]]:
        """[(wall_time, step, value)] of every scalar tag of ``run``."""
        tags = self.get("data/plugin/scalars/tags").get(run, {})
        return {
            tag: [tuple(p) for p in self.get("data/plugin/scalars/scalars", run=run, tag=tag)]
            for tag in tags
        }

    def wait_for(
        self, runs: set[str], points: dict[str, int]
    ) -> dict[str, dict[str, list[tuple[float, int, float]]]]:
        """The scalars of ``runs`` once each has at least ``points[tag]`` points
        of every tag (the server loads in the background), or as they are at the
        deadline."""
        deadline = time.monotonic() + DEADLINE
        while True:
            got: dict[str, dict[str, list[tuple[float, int, float]]]] = {}
            try:
                if runs <= set(self.get("data/runs")):
                    got = {run: self.scalars(run) for run in runs}
            except OSError:  # not answering yet
                pass
            complete = bool(got) and all(
                len(data.get(tag, [])) >= n for data in got.values() for tag, n in points.items()
            )
            if complete or time.monotonic() > deadline:
                return got
            self.check_running()
            time.sleep(0.25)

    def stop(self) -> None:
        """Ends the server by its pid: SIGTERM, then SIGKILL after 10 s."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._out.close()
