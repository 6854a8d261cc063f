"""torchmon.SystemStats (docs/guide.md, "System stats"; docs/reliability.md,
"System stats"): its CPU and memory figures against psutil's and /proc's own
readings taken in the same test, on both of its sources; its degradation
when a source fails; fork and exit in child processes; the GPU paths with a
stand-in pynvml and torch, and with the real ones where a GPU is present."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support import run_python

import torchmon
from torchmon._system import _cpus_available

psutil = pytest.importorskip("psutil")

HOUR = 3600.0
MB = 1 << 20


def proc_cpu_seconds() -> float:
    """This process's user + system CPU time, as /proc/self/stat gives it."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def busy_thread(cpu_seconds: float) -> None:
    """Spins a thread until this process used ``cpu_seconds`` more CPU time
    (work done, however loaded the machine is: no clock involved)."""

    def spin() -> None:
        start = os.times()
        while True:
            now = os.times()
            if now.user + now.system - start.user - start.system >= cpu_seconds:
                return

    thread = threading.Thread(target=spin)
    thread.start()
    thread.join()


@pytest.mark.parametrize("source", ["psutil", "proc"])
def test_a_busy_thread_shows_in_process_cpu_utilization_as_psutil_and_proc_see_it(
    source: str,
) -> None:
    import time

    sampler = torchmon.SystemStats(HOUR, HOUR, source=source, gpu=False, io=False)
    assert sampler.source == source
    process = psutil.Process()
    try:
        sampler.sample_now()
        t0, ps0, pr0 = time.monotonic(), process.cpu_times(), proc_cpu_seconds()
        busy_thread(0.5)
        got = sampler.sample_now()
        t1, ps1, pr1 = time.monotonic(), process.cpu_times(), proc_cpu_seconds()
    finally:
        sampler.close()
    ncpu = _cpus_available()
    # One core's worth, as psutil and /proc saw the same stretch of time.
    by_psutil = (ps1.user + ps1.system - ps0.user - ps0.system) / (t1 - t0)
    by_proc = (pr1 - pr0) / (t1 - t0)
    per_core = got["process.cpu.utilization"] * ncpu
    # The unit is OpenTelemetry's: a fraction of the CPUs available.
    assert 0.0 <= got["process.cpu.utilization"] <= 1.0
    assert per_core == pytest.approx(by_psutil, abs=0.05)
    assert per_core == pytest.approx(by_proc, abs=0.05)
    # The busy thread's 0.5 s of CPU time, however long the machine (shared
    # with other jobs) took to give it: the utilisation times the stretch.
    assert per_core * (t1 - t0) == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("source", ["psutil", "proc"])
def test_process_cpu_time_below_a_clock_tick_still_shows(source: str) -> None:
    """A mostly idle process (the demo sleeps through its steps) used a few
    milliseconds of CPU between samples: that shows as such, not as 0 or a
    whole 10 ms clock tick."""
    import time

    sampler = torchmon.SystemStats(HOUR, HOUR, source=source, gpu=False, io=False)
    try:
        outer_start = time.monotonic()
        sampler.sample_now()
        inner_start = time.monotonic()
        start = time.thread_time()
        while time.thread_time() - start < 0.003:
            pass
        inner_end = time.monotonic()
        got = sampler.sample_now()
        outer_end = time.monotonic()
    finally:
        sampler.close()
    # The sampler divides the CPU time by its own elapsed time, read inside
    # the two sample_now() calls: between the inner and the outer brackets,
    # however long a loaded machine kept this process waiting around them.
    per_second = got["process.cpu.utilization"] * _cpus_available()
    assert per_second * (outer_end - outer_start) >= 0.003
    assert per_second * (inner_end - inner_start) < 0.009


@pytest.mark.parametrize("source", ["psutil", "proc"])
def test_200_mb_touched_shows_in_resident_memory_as_psutil_and_proc_see_it(source: str) -> None:
    sampler = torchmon.SystemStats(HOUR, HOUR, source=source, gpu=False, io=False)
    try:
        before = sampler.sample_now()["process.memory.usage"]
        buffer = bytearray(200 * MB)
        buffer[:: os.sysconf("SC_PAGE_SIZE")] = b"\x01" * (200 * MB // os.sysconf("SC_PAGE_SIZE"))
        got = sampler.sample_now()
        by_psutil, by_proc = psutil.Process().memory_info().rss, proc_rss()
        del buffer
    finally:
        sampler.close()
    after = got["process.memory.usage"]
    assert after - before >= 190 * MB
    assert after == pytest.approx(by_psutil, abs=8 * MB)
    assert after == pytest.approx(by_proc, abs=8 * MB)
    assert got["process.thread.count"] == psutil.Process().num_threads()


@pytest.mark.parametrize("source", ["psutil", "proc"])
def test_host_memory_and_cpu_against_psutil(source: str) -> None:
    sampler = torchmon.SystemStats(HOUR, HOUR, source=source, gpu=False, io=True)
    try:
        sampler.sample_now()
        psutil.cpu_percent(interval=None)
        busy_thread(0.2)
        got = sampler.sample_now()
        host_cpu = psutil.cpu_percent(interval=None) / 100.0
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
    finally:
        sampler.close()
    used = memory.total - memory.available
    assert got["system.memory.usage"] == pytest.approx(used, abs=64 * MB)
    assert got["system.memory.utilization"] == pytest.approx(used / memory.total, abs=0.01)
    assert got["system.cpu.utilization"] == pytest.approx(host_cpu, abs=0.1)
    if swap.total:
        assert got["system.paging.utilization"] == pytest.approx(swap.percent / 100, abs=0.01)
    else:
        assert "system.paging.utilization" not in got  # no swap: no figure
    for name in (
        "system.disk.io.read",
        "system.disk.io.write",
        "system.network.io.receive",
        "system.network.io.transmit",
    ):
        assert got[name] >= 0.0


def test_the_figures_reach_the_handlers_as_stat_windows() -> None:
    events: list[torchmon.Event] = []
    handle = torchmon.register_event_handler(events.append)
    try:
        with torchmon.SystemStats(HOUR, HOUR, gpu=False, io=False) as sampler:
            assert sampler.running
            busy_thread(0.05)  # the host's CPU counters move on (in 10 ms ticks)
            sampler.sample_now()
            names = set(sampler.stats)
        assert not sampler.running and sampler.closed
    finally:
        torchmon.unregister_event_handler(handle)
    data: dict[str, Any] = {}
    for event in events:
        assert event.name == torchmon.STAT_EVENT
        data.update(event.data)
    assert {
        "process.cpu.utilization",
        "process.memory.usage",
        "process.thread.count",
        "system.cpu.utilization",
        "system.memory.utilization",
    } <= names
    assert {"process.cpu.utilization.mean", "process.cpu.utilization.max"} <= set(data)
    assert data["process.memory.usage.max"] > 10 * MB


def test_without_psutil_it_reads_proc() -> None:
    result = run_python(
        """
        import json, os, sys
        sys.modules["psutil"] = None  # not importable
        import torchmon
        sampler = torchmon.SystemStats(3600.0, 3600.0, gpu=False)
        sampler.sample_now()
        start = os.times()
        while os.times().user - start.user < 0.05:  # the CPU counters move on
            pass
        got = sampler.sample_now()
        sampler.close()
        print(json.dumps([sampler.source, sorted(got)]))
        """
    )
    assert result.returncode == 0, result.stderr
    source, names = json.loads(result.stdout)
    assert source == "proc"
    assert {"process.cpu.utilization", "process.memory.usage", "system.cpu.utilization"} <= set(
        names
    )


def test_asking_for_psutil_without_it_is_a_clear_error() -> None:
    result = run_python(
        """
        import sys
        sys.modules["psutil"] = None
        import torchmon
        try:
            torchmon.SystemStats(source="psutil")
        except ImportError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "psutil is not installed" in result.stdout
    # Commands that work: torchmon is on no package index (README.md).
    assert "pip install psutil; in a torchmon checkout: pip install '.[system]'" in result.stdout
    assert "torchmon[" not in result.stdout


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"interval": 0}, ValueError, "SystemStats(interval): interval must be a positive"),
        ({"interval": "10"}, TypeError, "SystemStats(interval): interval must be a"),
        ({"interval": True}, TypeError, "SystemStats(interval)"),
        # longer than the sampler thread's Event.wait takes (it died of OverflowError)
        ({"interval": 1e10}, ValueError, "SystemStats(interval): interval must be at most"),
        ({"interval": timedelta.max}, ValueError, "SystemStats(interval): interval must be at "),
        ({"window_size": 0.0}, ValueError, "SystemStats(window_size)"),
        # An int is taken, as by every API but Stat (docs/api.md, "Window sizes").
        ({"window_size": "60"}, TypeError, "SystemStats(window_size)"),
        ({"source": "sysfs"}, ValueError, "SystemStats(source): source must be"),
        ({"gpu": 1}, TypeError, "SystemStats(gpu): gpu must be a bool"),
    ],
)
def test_bad_arguments_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        torchmon.SystemStats(**kwargs)
    assert str(info.value).startswith(message)


def test_the_longest_interval_accepted_keeps_the_sampler_running() -> None:
    """threading.TIMEOUT_MAX, the bound SystemStats checks, is a wait the
    sampler thread can make (docs/api.md, "SystemStats")."""
    import time

    sampler = torchmon.SystemStats(threading.TIMEOUT_MAX, HOUR, source="proc", gpu=False, io=False)
    try:
        sampler.start()
        time.sleep(0.2)  # time for a wait that overflows to kill the thread
        assert sampler.running
    finally:
        sampler.close()


def test_a_failing_source_is_absent_with_one_log_line_and_the_rest_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = torchmon.SystemStats(HOUR, HOUR, source="proc", gpu=False, io=False)

    def denied() -> tuple[int, int, int, int]:
        raise PermissionError(13, "Permission denied", "/proc/meminfo")

    monkeypatch.setattr(sampler._reader, "host_memory", denied)
    caplog.set_level(logging.INFO, logger="torchmon")
    try:
        for _ in range(3):
            got = sampler.sample_now()
    finally:
        sampler.close()
    assert "system.memory.utilization" not in got
    assert "process.memory.usage" in got and "process.thread.count" in got
    lines = [r for r in caplog.records if r.name == "torchmon"]
    assert len(lines) == 1
    assert lines[0].levelno == logging.WARNING
    assert "system memory" in lines[0].getMessage()
    assert "Permission denied" in lines[0].getMessage()


def test_a_raising_handler_does_not_stop_the_sampler_thread() -> None:
    result = run_python(
        """
        import sys, time, torchmon
        reported = []
        sys.unraisablehook = lambda u: reported.append(u.exc_type.__name__)
        def bad(event):
            raise RuntimeError("handler")
        torchmon.register_event_handler(bad)
        sampler = torchmon.SystemStats(0.01, 0.001, gpu=False, io=False).start()
        while len(reported) < 5:   # the 1 ms windows close at every sample
            time.sleep(0.01)
        print(sampler.running, set(reported))
        sampler.close()
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True {'RuntimeError'}"


def test_the_running_sampler_window_is_emitted_at_exit(tmp_path: Path) -> None:
    """A sampler left running: its last sample and the Stats' windows reach
    the sink before atexit handlers close it (docs/reliability.md)."""
    out = tmp_path / "events.jsonl"
    result = run_python(
        f"""
        import atexit, torchmon
        sink = torchmon.JsonlEventHandler({str(out)!r})
        torchmon.register_event_handler(sink)
        sampler = torchmon.SystemStats(3600.0, 3600.0, gpu=False).start()
        import os
        start = os.times()
        while os.times().user - start.user < 0.1:  # some CPU time to see
            pass
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data: dict[str, Any] = {}
    for event in torchmon.read_jsonl(str(out)):
        data.update(event.data)
    # Rates need two samples: the one at start and the one taken at exit.
    assert data["process.cpu.utilization.mean"] > 0.0
    assert data["process.memory.usage.value"] > 10 * MB
    assert "system.cpu.utilization.mean" in data


def test_at_exit_the_last_windows_come_before_any_atexit_handler(tmp_path: Path) -> None:
    """A sink that an atexit handler closes (as tensorboardX's writers are)
    has the sampler's last windows by then."""
    out = tmp_path / "seen.json"
    result = run_python(
        f"""
        import atexit, json, os, torchmon
        seen = []
        torchmon.register_event_handler(lambda event: seen.extend(event.data))
        sampler = torchmon.SystemStats(3600.0, 3600.0, gpu=False, io=False).start()
        atexit.register(lambda: open({str(out)!r}, "w").write(json.dumps(seen)))
        start = os.times()
        while os.times().user - start.user < 0.1:
            pass
        """
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert "process.cpu.utilization.mean" in seen
    assert "process.memory.usage.value" in seen


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("source", ["psutil", "proc"])
def test_fork_stops_the_child_sampler_and_start_there_samples_the_child(source: str) -> None:
    code = """
        import json, os, sys, time, warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        import torchmon
        sampler = torchmon.SystemStats(0.02, 3600.0, source=SOURCE, gpu=False, io=False)
        sampler.start()
        sampler.sample_now()
        pid = os.fork()
        if pid == 0:
            state = {"running_after_fork": sampler.running}
            sampler.start()
            state["running_after_start"] = sampler.running
            # The child's own memory, not the parent's: 200 MB more.
            page = os.sysconf("SC_PAGE_SIZE")
            buffer = bytearray(200 << 20)
            buffer[::page] = b"\\x01" * ((200 << 20) // page)
            got = sampler.sample_now()
            with open("/proc/self/status") as f:
                vmrss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
            parent = open(f"/proc/{os.getppid()}/status").read()
            state["child_rss"] = got["process.memory.usage"]
            state["child_vmrss"] = vmrss
            state["parent_vmrss"] = next(
                int(l.split()[1]) * 1024 for l in parent.splitlines() if l.startswith("VmRSS:")
            )
            sampler.close()
            state["closed"] = sampler.closed
            os.write(1, (json.dumps(state) + "\\n").encode())
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"parent_running": sampler.running, "child_status": status}))
        sampler.close()
        """
    result = run_python(code.replace("SOURCE", repr(source)))
    assert result.returncode == 0, result.stderr
    child, parent = (json.loads(line) for line in result.stdout.splitlines())
    assert child["running_after_fork"] is False
    assert child["running_after_start"] is True
    assert child["child_rss"] == pytest.approx(child["child_vmrss"], abs=8 * MB)
    assert child["child_rss"] > child["parent_vmrss"] + 150 * MB
    assert child["closed"] is True
    assert parent == {"parent_running": True, "child_status": 0}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_that_never_restarts_it_exits_cleanly() -> None:
    result = run_python(
        """
        import os, sys, warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        import torchmon
        sampler = torchmon.SystemStats(0.01, 3600.0, gpu=False).start()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)   # the normal exit path: atexit, the exit flush
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


# --- GPU paths ---------------------------------------------------------------


class _FakeNvml(types.ModuleType):
    """pynvml's functions this sampler calls, for two GPUs; the second has no
    power reading (NVML's NotSupported on some boards)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return types.SimpleNamespace(gpu=[75, 10][h], memory=5)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return types.SimpleNamespace(used=[3 * MB, 5 * MB][h], total=80 * 1024 * MB, free=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 250_500  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 400_000

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 61


def test_nvml_figures_per_gpu_in_otel_units(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    for variable in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    caplog.set_level(logging.INFO, logger="torchmon")
    sampler = torchmon.SystemStats(HOUR, HOUR, gpu=True, io=False)
    try:
        sampler.sample_now()
        got = sampler.sample_now()
    finally:
        sampler.close()
    assert fake.inits == 1
    assert got["hw.gpu.0.utilization"] == 0.75
    assert got["hw.gpu.1.utilization"] == 0.10
    assert got["hw.gpu.0.memory.usage"] == 3 * MB
    assert got["hw.gpu.0.memory.limit"] == 80 * 1024 * MB
    assert got["hw.gpu.0.power"] == 250.5  # W
    assert got["hw.gpu.0.power.limit"] == 400.0
    assert got["hw.gpu.0.temperature"] == 61.0
    assert "hw.gpu.1.power" not in got and got["hw.gpu.1.power.limit"] == 400.0
    messages = [r.getMessage() for r in caplog.records if r.name == "torchmon"]
    assert len(messages) == 1 and "hw.gpu.1.power" in messages[0]


def test_cuda_visible_devices_picks_and_orders_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    sampler = torchmon.SystemStats(HOUR, HOUR, io=False)
    try:
        got = sampler.sample_now()
    finally:
        sampler.close()
    # NVML's GPU 1 is this process's cuda:0.
    assert got["hw.gpu.0.utilization"] == 0.10
    assert not any(name.startswith("hw.gpu.1.") for name in got)


def test_under_torchrun_with_a_gpu_per_rank_only_this_rank_gpu_is_sampled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for variable, value in {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
    }.items():
        monkeypatch.setenv(variable, value)
    sampler = torchmon.SystemStats(HOUR, HOUR, io=False)
    try:
        got = sampler.sample_now()
    finally:
        sampler.close()
    # torchmon.rank_info(): local rank 1 of 2 on a node of 2 GPUs uses cuda:1.
    assert got["hw.gpu.1.utilization"] == 0.10
    assert not any(name.startswith("hw.gpu.0.") for name in got)


def test_nvml_that_fails_to_start_means_no_gpu_figures_and_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = _FakeNvml()

    def no_driver() -> None:
        raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    fake.nvmlInit = no_driver  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    caplog.set_level(logging.INFO, logger="torchmon")
    sampler = torchmon.SystemStats(HOUR, HOUR, io=False)
    try:
        got = [sampler.sample_now() for _ in range(3)][-1]
    finally:
        sampler.close()
    assert not any(name.startswith("hw.gpu.") for name in got)
    assert "process.memory.usage" in got
    messages = [r.getMessage() for r in caplog.records if r.name == "torchmon"]
    assert messages == ["torchmon.SystemStats: no NVML GPU figures: NVML_ERROR_DRIVER_NOT_LOADED"]


def _fake_torch(initialized: bool) -> types.ModuleType:
    torch = types.ModuleType("torch")
    stats = {
        "allocated_bytes.all.current": 100.0 * MB,
        "allocated_bytes.all.peak": 150.0 * MB,
        "reserved_bytes.all.current": 200.0 * MB,
        "reserved_bytes.all.peak": 256.0 * MB,
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_initialized=lambda: initialized,
        device_count=lambda: 2,
        # cuda:1 never allocated: its stats are empty
        memory_stats=lambda device: stats if device == 0 else {},
    )
    return torch


def test_torch_cuda_allocator_figures_when_the_program_initialised_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(initialized=True))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sampler = torchmon.SystemStats(HOUR, HOUR, io=False)
    try:
        got = sampler.sample_now()
    finally:
        sampler.close()
    cuda = {k: v for k, v in got.items() if k.startswith("torch.cuda.")}
    assert cuda == {
        "torch.cuda.0.memory.allocated": 100.0 * MB,
        "torch.cuda.0.memory.allocated.peak": 150.0 * MB,
        "torch.cuda.0.memory.reserved": 200.0 * MB,
        "torch.cuda.0.memory.reserved.peak": 256.0 * MB,
        "torch.cuda.0.alloc_retries": 2.0,
        "torch.cuda.0.ooms": 1.0,
    }


def test_torch_without_initialised_cuda_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = _fake_torch(initialized=False)

    def must_not_be_called(device: int) -> dict[str, float]:
        raise AssertionError("memory_stats read before the program initialised CUDA")

    torch.cuda.memory_stats = must_not_be_called  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    sampler = torchmon.SystemStats(HOUR, HOUR, io=False)
    try:
        got = sampler.sample_now()
    finally:
        sampler.close()
    assert not any(k.startswith("torch.cuda.") for k in got)


def test_the_sampler_never_imports_torch_or_pynvml() -> None:
    result = run_python(
        """
        import sys, torchmon
        sampler = torchmon.SystemStats(3600.0, 3600.0)
        sampler.sample_now()
        sampler.close()
        print(sorted(m for m in ("torch", "pynvml") if m in sys.modules))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_real_gpu_figures() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as exc:
        pytest.skip(f"NVML does not start here: {exc}")
    if count == 0:
        pytest.skip("no GPU")
    sampler = torchmon.SystemStats(HOUR, HOUR, io=False)
    try:
        got = sampler.sample_now()
    finally:
        sampler.close()
    memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert got["hw.gpu.0.memory.limit"] == memory.total
    assert 0.0 <= got["hw.gpu.0.utilization"] <= 1.0


def test_lazy_export_and_import_cost() -> None:
    result = run_python(
        """
        import sys, torchmon
        assert "torchmon._system" not in sys.modules and "logging" not in sys.modules
        assert "SystemStats" in dir(torchmon) and "SystemStats" in torchmon.__all__
        from torchmon import SystemStats
        from torchmon._system import SystemStats as defined
        assert SystemStats is defined is torchmon.SystemStats
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
