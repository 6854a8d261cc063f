"""What MLflowEventHandler costs the training thread, against logging the
same values with ``mlflow.log_metrics`` every step, and how many windows per
second it delivers to a sqlite store and to a local ``mlflow server``.

Run:  python benches/bench_trackers.py [--steps 20000] [--values 10] [--no-server] [--wandb]

1. Training thread, per step, ``--values`` values (one per Stat, MEAN and
   P99): Stat.add alone (no handler), the same with MLflowEventHandler
   registered on a sqlite store (windows of 100 steps, a manual clock: 1 ms
   a step), and ``mlflow.log_metrics`` of the same values in the same run
   (sqlite; fewer steps: it is slow).
2. Delivery: ``--windows`` windows of ``--values`` Stats queued at once,
   then the time until ``flush()`` saw them delivered: windows/s and
   metrics/s, to sqlite and to ``mlflow server`` on 127.0.0.1 (sqlite
   backend).

3. ``--wandb``: W&B offline (``WANDB_MODE=offline``, every file in a
   temporary directory): Stat.add with WandbEventHandler registered, against
   ``run.log`` of the same values every step in the same run (fewer steps).
   ``--wandb-only`` skips MLflow.

Needs the mlflow extra (the wandb one for ``--wandb``). Figures:
docs/performance.md, "Tracker sinks".
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import torchmon
from torchmon import Aggregation, Stat
from torchmon.testing import ManualClock

try:
    import mlflow
except ImportError:
    mlflow = None


def stats(n: int, prefix: str) -> list[Stat]:
    return [
        Stat(f"{prefix}.s{i}", [Aggregation.MEAN, Aggregation.P99], timedelta(milliseconds=100))
        for i in range(n)
    ]


def per_step_stat_add(steps: int, values: int, prefix: str) -> float:
    """Seconds per step of ``values`` Stat.add calls, windows every 100 steps."""
    with ManualClock(0) as clock:
        group = stats(values, prefix)
        start = time.perf_counter()
        for step in range(steps):
            for stat in group:
                stat.add(float(step))
            clock.advance(1)
        return (time.perf_counter() - start) / steps


def per_step_log_metrics(steps: int, values: int, run_id: str) -> float:
    with mlflow.start_run(run_id=run_id):
        start = time.perf_counter()
        for step in range(steps):
            mlflow.log_metrics({f"direct.s{i}": float(step) for i in range(values)}, step=step)
        return (time.perf_counter() - start) / steps


def delivery(uri: str, windows: int, values: int, label: str) -> None:
    sink = torchmon.MLflowEventHandler(uri, experiment_name="bench", max_queue=windows + 10)
    handle = torchmon.register_event_handler(sink)
    try:
        sink.flush(60)  # the run exists; nothing queued yet
        with ManualClock(0) as clock:
            group = stats(values, f"delivery{label}")
            start = time.perf_counter()
            for _ in range(windows * 100 + 1):  # a window of every Stat each 100 steps
                for stat in group:
                    stat.add(1.0)
                clock.advance(1)
        queued = time.perf_counter()
        ok = sink.flush(600)
        end = time.perf_counter()
    finally:
        torchmon.unregister_event_handler(handle)
        sink.close()
    sent = windows * values
    print(
        f"  {label:>14}: {windows * values} windows ({sent * 2} metrics) delivered={ok} in "
        f"{end - start:.2f} s ({end - queued:.2f} s after the last was queued): "
        f"{windows * values / (end - start):,.0f} windows/s, "
        f"{sent * 2 / (end - start):,.0f} metrics/s"
    )


def start_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [exe, "server", "--backend-store-uri", f"sqlite:///{tmp / 'server.db'}",
         "--default-artifact-root", str(tmp / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1):
                return server, uri
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit("mlflow server did not start")
            time.sleep(0.25)


def offline_wandb(root: Path) -> None:
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME"):
        os.environ.pop(name, None)
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_ERROR_REPORTING="false",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        WANDB_CONSOLE="off",
        WANDB_DIR=str(root),
        WANDB_CONFIG_DIR=str(root / "config"),
        WANDB_CACHE_DIR=str(root / "cache"),
        WANDB_DATA_DIR=str(root / "data"),
        WANDB_ARTIFACT_DIR=str(root / "artifacts"),
    )


def bench_wandb(tmp: Path, steps: int, direct_steps: int, values: int) -> None:
    try:
        import wandb
    except ImportError:
        sys.exit("--wandb needs W&B: pip install '.[wandb]'")
    offline_wandb(tmp)
    run = wandb.init(project="torchmon-bench", name="bench")
    print(f"training thread, per step of {values} values (W&B offline):")
    bare = per_step_stat_add(steps, values, "wbare")
    sink = torchmon.WandbEventHandler(run)
    handle = torchmon.register_event_handler(sink)
    try:
        with_sink = per_step_stat_add(steps, values, "wsink")
        delivered = sink.flush(120)
    finally:
        torchmon.unregister_event_handler(handle)
        sink.close()
    start = time.perf_counter()
    for step in range(direct_steps):
        run.log({f"direct.s{i}": float(step) for i in range(values)})
    direct = (time.perf_counter() - start) / direct_steps
    run.finish()
    per_value = values / 1e9
    print(
        f"  Stat.add only:            {bare * 1e6:9.3f} us/step ({bare / per_value:.0f} ns/value)"
    )
    print(
        f"  Stat.add + W&B handler:   {with_sink * 1e6:9.3f} us/step "
        f"({with_sink / per_value:.0f} ns/value; windows every 100 steps; delivered={delivered})"
    )
    print(f"  run.log:                  {direct * 1e6:9.3f} us/step")
    print(f"  run.log / handler:        {direct / with_sink:,.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--values", type=int, default=10)
    parser.add_argument("--direct-steps", type=int, default=200)
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--no-server", action="store_true")
    parser.add_argument("--wandb", action="store_true")
    parser.add_argument("--wandb-only", action="store_true")
    parser.add_argument("--wandb-direct-steps", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.wandb or args.wandb_only:
            bench_wandb(tmp, args.steps, args.wandb_direct_steps, args.values)
            if args.wandb_only:
                return
        if mlflow is None:
            sys.exit("bench_trackers.py needs MLflow: pip install '.[mlflow]'")
        uri = f"sqlite:///{tmp / 'mlflow.db'}"
        print(f"training thread, per step of {args.values} values (sqlite store):")
        bare = per_step_stat_add(args.steps, args.values, "bare")
        sink = torchmon.MLflowEventHandler(uri, experiment_name="bench")
        handle = torchmon.register_event_handler(sink)
        try:
            with_sink = per_step_stat_add(args.steps, args.values, "sink")
            sink.flush(120)
        finally:
            torchmon.unregister_event_handler(handle)
            sink.close()
        assert sink.run_id is not None
        mlflow.set_tracking_uri(uri)
        direct = per_step_log_metrics(args.direct_steps, args.values, sink.run_id)
        per_value = args.values / 1e9
        print(
            f"  Stat.add only:             {bare * 1e6:9.3f} us/step "
            f"({bare / per_value:.0f} ns/value)"
        )
        print(
            f"  Stat.add + MLflow handler: {with_sink * 1e6:9.3f} us/step "
            f"({with_sink / per_value:.0f} ns/value; windows every 100 steps)"
        )
        print(f"  mlflow.log_metrics:        {direct * 1e6:9.3f} us/step")
        print(f"  log_metrics / handler:     {direct / with_sink:,.0f}x")
        print("delivery:")
        delivery(uri, args.windows, args.values, "sqlite")
        if not args.no_server:
            server, server_uri = start_server(tmp)
            try:
                delivery(server_uri, args.windows, args.values, "mlflow server")
            finally:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


if __name__ == "__main__":
    main()
