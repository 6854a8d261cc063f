"""Makes docs/screenshots/tensorboard-demo.png, README's picture of what
TensorBoard's Scalars dashboard shows for `torchmon demo`.

Runs the demo into a temporary directory, serves it with the `tensorboard`
of this Python's environment (default loader settings), waits until every
window is loaded, and takes a headless Chromium screenshot of the Scalars
dashboard. Not part of CI. Needs torchmon with the `tensorboard` extra and
Chromium (Debian: `apt-get install chromium`):

    .venv/bin/python docs/screenshots/make_tensorboard_screenshot.py [--out PNG]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
# 6 epochs of about 1 s each: 6 or 7 one-second windows per Stat
DEMO_OPTIONS = ["--epochs", "6", "--steps", "800", "--seed", "0"]
# The Stat "train.loss" (its four aggregations) and the per-epoch loss and
# accuracy; no smoothing, so each window is its own point.
DASHBOARD = "#scalars&_smoothingWeight=0&tagFilter=" + urllib.parse.quote(
    r"^train\.(loss\.|epoch_end/(loss|accuracy))", safe=""
)
DEADLINE = 90.0


def tensorboard_command() -> list[str]:
    script = Path(sys.executable).parent / "tensorboard"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tensorboard.main"]


def find_chromium(given: str | None) -> str:
    for name in [given] if given else ["chromium", "chromium-browser", "google-chrome"]:
        found = shutil.which(name)
        if found:
            return found
    sys.exit("no Chromium found: apt-get install chromium, or give --chromium PATH")


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def serve_and_shoot(logdir: Path, windows: int, out: Path, chromium: str, work: Path) -> None:
    log = work / "tensorboard.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            # --logdir relative to cwd: the dashboard shows it as "demo"
            [*tensorboard_command(), "--logdir", logdir.name, "--host", "127.0.0.1", "--port", "0"],
            cwd=logdir.parent,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + DEADLINE
            url = None
            while time.monotonic() < deadline:
                if server.poll() is not None:
                    sys.exit(f"tensorboard exited:\n{log.read_text()}")
                if url is None:
                    found = re.search(r"at (http://127\.0\.0\.1:\d+/)", log.read_text())
                    url = found.group(1) if found else None
                if url is not None:
                    try:
                        points = get_json(
                            f"{url}data/plugin/scalars/scalars?run=.&tag=train.loss.mean"
                        )
                    except OSError:  # not loaded yet (404) or not answering
                        points = []
                    if isinstance(points, list) and len(points) >= windows:
                        break
                time.sleep(0.25)
            else:
                sys.exit(f"tensorboard did not load the demo in {DEADLINE} s:\n{log.read_text()}")
            subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    f"--screenshot={out}",
                    "--window-size=1700,770",
                    "--virtual-time-budget=20000",
                    url + DASHBOARD,
                ],
                check=True,
                timeout=120,
                capture_output=True,
            )
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "tensorboard-demo.png")
    parser.add_argument("--chromium", help="the Chromium binary (default: found on PATH)")
    args = parser.parse_args()
    chromium = find_chromium(args.chromium)
    with tempfile.TemporaryDirectory(prefix="torchmon-screenshot-") as tmp:
        work = Path(tmp)
        logdir = work / "demo"
        subprocess.run(
            [sys.executable, "-m", "torchmon", "demo", "--logdir", str(logdir), *DEMO_OPTIONS],
            check=True,
            timeout=300,
            stdout=subprocess.DEVNULL,
        )
        # train.loss's windows, to wait until TensorBoard has loaded them all.
        windows = sum(
            '"train.loss.mean"' in line
            for line in (logdir / "events.jsonl").read_text().splitlines()
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        serve_and_shoot(logdir, windows, args.out.resolve(), chromium, work)
    print(f"wrote {args.out} ({windows} windows of train.loss)")


if __name__ == "__main__":
    main()
