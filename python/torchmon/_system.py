"""``torchmon.SystemStats``: CPU, memory and GPU figures of this process and
its host, sampled on a daemon thread into ordinary Stats (docs/guide.md,
"System stats"; guarantees in docs/reliability.md, "System stats").

Nothing here runs on the training loop's thread: the sampler thread reads
psutil (or Linux's /proc without it), NVML through ``pynvml`` when it is
installed, and torch's CUDA allocator when torch was imported and CUDA
initialised by the program, and adds what it read to one Stat per figure.
A source that fails is absent from the output, with one log line on the
``torchmon`` logger; the sampler never raises into the program.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from datetime import timedelta

from ._core import Aggregation, Stat, _window_ms
from ._errors import arg_type_error, arg_value_error, report_unraisable
from ._forksafe import new_lock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

__all__ = ["SystemStats"]

_log = logging.getLogger("torchmon")

_A = Aggregation
# Which aggregations each kind of figure gets: a utilisation's mean shows the
# load, its min and max the stalls and the peaks; a level (bytes, threads,
# watts, degrees) its last value and its peak; a limit or a running total
# only its last value.
_UTILIZATION = (_A.MEAN, _A.MIN, _A.MAX)
_LEVEL = (_A.VALUE, _A.MAX)
_LAST = (_A.VALUE,)
_RATE = (_A.MEAN, _A.MAX)

_SOURCES = ("auto", "psutil", "proc")


def _cpus_available() -> int:
    """The CPUs this process may run on (its affinity mask), the divisor of
    OpenTelemetry's process.cpu.utilization."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# --- readers: raw counters, one method per source ----------------------------


class _ProcReader:
    """Reads Linux's /proc directly (no psutil)."""

    name = "proc"

    def __init__(self) -> None:
        self._ticks = float(os.sysconf("SC_CLK_TCK"))

    def after_fork(self) -> None:
        pass  # /proc/self is the child's own

    def process_memory(self) -> tuple[int, int]:
        """(resident bytes, threads)."""
        rss = threads = None
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1]) * 1024  # kB
                elif line.startswith(b"Threads:"):
                    threads = int(line.split()[1])
        if rss is None or threads is None:
            raise OSError("/proc/self/status has no VmRSS or Threads line")
        return rss, threads

    def host_cpu(self) -> tuple[float, float]:
        """(busy, total) seconds of all CPUs since boot."""
        with open("/proc/stat", "rb") as f:
            first = f.readline().split()
        # user nice system idle iowait irq softirq steal [guest guest_nice]:
        # guest time is already counted in user and nice.
        ticks = [int(x) for x in first[1:9]]
        total = float(sum(ticks))
        busy = total - ticks[3] - ticks[4]
        return busy / self._ticks, total / self._ticks

    def host_memory(self) -> tuple[int, int, int, int]:
        """(total, available, swap total, swap free) bytes."""
        found: dict[bytes, int] = {}
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                key, _, rest = line.partition(b":")
                if key in (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree"):
                    found[key] = int(rest.split()[0]) * 1024
        return (
            found[b"MemTotal"],
            found[b"MemAvailable"],
            found.get(b"SwapTotal", 0),
            found.get(b"SwapFree", 0),
        )

    def disk_bytes(self) -> tuple[int, int]:
        """(read, written) bytes of the whole disks (not their partitions,
        which would count twice): the devices /sys/block lists."""
        disks = set(os.listdir("/sys/block"))
        read = written = 0
        with open("/proc/diskstats", "rb") as f:
            for line in f:
                fields = line.split()
                if fields[2].decode() in disks:
                    read += int(fields[5]) * 512  # sectors are 512 bytes here
                    written += int(fields[9]) * 512
        return read, written

    def network_bytes(self) -> tuple[int, int]:
        """(received, sent) bytes of every interface but loopback."""
        received = sent = 0
        with open("/proc/net/dev", "rb") as f:
            for line in f.readlines()[2:]:
                iface, _, rest = line.partition(b":")
                if iface.strip() == b"lo":
                    continue
                fields = rest.split()
                received += int(fields[0])
                sent += int(fields[8])
        return received, sent


class _PsutilReader:
    """The same counters through psutil."""

    name = "psutil"

    def __init__(self, psutil: ModuleType) -> None:
        self._psutil = psutil
        self._process = psutil.Process()

    def after_fork(self) -> None:
        # A psutil.Process is bound to a pid: the parent's, in a forked child.
        self._process = self._psutil.Process()

    def process_memory(self) -> tuple[int, int]:
        with self._process.oneshot():
            return int(self._process.memory_info().rss), int(self._process.num_threads())

    def host_cpu(self) -> tuple[float, float]:
        times = self._psutil.cpu_times()
        # psutil's own cpu_percent() rule: guest time is inside user and nice.
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        busy = total - times.idle - getattr(times, "iowait", 0.0)
        return float(busy), float(total)

    def host_memory(self) -> tuple[int, int, int, int]:
        memory = self._psutil.virtual_memory()
        swap = self._psutil.swap_memory()
        return int(memory.total), int(memory.available), int(swap.total), int(swap.free)

    def disk_bytes(self) -> tuple[int, int]:
        counters = self._psutil.disk_io_counters()
        if counters is None:
            raise OSError("psutil sees no disk")
        return int(counters.read_bytes), int(counters.write_bytes)

    def network_bytes(self) -> tuple[int, int]:
        received = sent = 0
        for iface, counters in self._psutil.net_io_counters(pernic=True).items():
            if iface != "lo":
                received += counters.bytes_recv
                sent += counters.bytes_sent
        return int(received), int(sent)


def _import_psutil() -> ModuleType | None:
    try:
        import psutil  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    return psutil  # type: ignore[no-any-return, unused-ignore]


# --- the sampler ---------------------------------------------------------------

_samplers: weakref.WeakSet[SystemStats] = weakref.WeakSet()


class SystemStats:
    """Samples CPU, memory and GPU figures every ``interval`` on a daemon
    thread into Stats of ``window_size`` windows named after OpenTelemetry's
    semantic conventions (``process.cpu.utilization``, ...; docs/guide.md,
    "System stats").

    ``start()`` (or ``with SystemStats(...)``) starts the thread; ``close()``
    stops it, takes a last sample and emits the Stats' open windows. At
    interpreter exit a running sampler is closed the same way, before the
    exit flush. In a forked child the sampler is stopped; ``start()`` there
    starts a new thread sampling the child.

    ``source``: ``"auto"`` (psutil when importable, else /proc), ``"psutil"``
    or ``"proc"``. ``gpu``: read NVML (``pynvml``) and torch's CUDA
    allocator. ``io``: disk and network byte rates.
    """

    def __init__(
        self,
        interval: timedelta | float = timedelta(seconds=10),
        window_size: timedelta | float = timedelta(seconds=60),
        *,
        source: str = "auto",
        gpu: bool = True,
        io: bool = True,
    ) -> None:
        self._interval = _interval_seconds(interval)
        # The one window rule (docs/api.md, "Window sizes"), now rather than
        # on the sampler thread.
        self._window_size = timedelta(
            milliseconds=_window_ms("SystemStats", "window_size", window_size)
        )
        if not isinstance(source, str):
            raise arg_type_error("SystemStats", "source", "a str", source)
        if source not in _SOURCES:
            raise arg_value_error(
                "SystemStats", "source", f"must be 'auto', 'psutil' or 'proc', got {source!r}"
            )
        for arg, value in (("gpu", gpu), ("io", io)):
            if not isinstance(value, bool):
                raise arg_type_error("SystemStats", arg, "a bool", value)
        reader: _ProcReader | _PsutilReader
        psutil = None if source == "proc" else _import_psutil()
        if source == "psutil" and psutil is None:
            raise ModuleNotFoundError(
                "SystemStats(source='psutil'): psutil is not installed "
                "(pip install psutil; in a torchmon checkout: pip install '.[system]')",
                name="psutil",
            )
        reader = _PsutilReader(psutil) if psutil is not None else _ProcReader()
        self._reader = reader
        self._gpu = gpu
        self._io = io
        self._lock = new_lock()
        self._stats: dict[str, Stat] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._pid = os.getpid()
        self._logged: set[str] = set()
        self._reset_baselines()
        _samplers.add(self)

    def _reset_baselines(self) -> None:
        # The previous reading of each counter that a rate is taken from.
        self._last: dict[str, tuple[float, ...]] = {}
        self._ncpu = _cpus_available()
        self._nvml: list[tuple[int, Any]] | None = None  # (ordinal, handle), once NVML is up
        self._nvml_module: Any = None

    # --- public API ---

    @property
    def source(self) -> str:
        """``"psutil"`` or ``"proc"``: what the CPU and memory figures come from."""
        return self._reader.name

    @property
    def interval(self) -> float:
        """Seconds between two samples."""
        return self._interval

    @property
    def running(self) -> bool:
        """Whether the sampler thread runs in this process."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == os.getpid()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stats(self) -> dict[str, Stat]:
        """The Stats made so far, by name (a figure gets its Stat at its first
        reading; an absent source has none)."""
        with self._lock:
            return dict(self._stats)

    def start(self) -> SystemStats:
        """Takes a first sample on the calling thread (the baseline of the
        rates), then starts the sampler thread, which samples every
        ``interval``; no-op if it runs. Returns ``self``."""
        if self._closed:
            raise ValueError("SystemStats.start(): the sampler is closed")
        with self._lock:
            if self.running:
                return self
            self._stop = threading.Event()
            thread = threading.Thread(
                target=self._run, args=(self._stop,), name="torchmon-system-stats", daemon=True
            )
            self._thread = thread
        self._sample()
        thread.start()
        return self

    def sample_now(self) -> dict[str, float]:
        """Takes one sample on the calling thread and adds it to the Stats;
        returns the figures read, by name. Rates and utilisations are over
        the time since the previous sample (absent from the first one)."""
        if self._closed:
            raise ValueError("SystemStats.sample_now(): the sampler is closed")
        return self._sample()

    def close(self) -> None:
        """Stops the thread, takes a last sample if it was running, and emits
        the open window of every Stat (they are dropped). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, self._thread = self._thread, None
            stop = self._stop
        stop.set()
        was_running = thread is not None and self._pid == os.getpid()
        if was_running and thread is not threading.current_thread():
            assert thread is not None
            # A sample stuck in a driver call must not hold up the program's exit.
            thread.join(timeout=5.0)
            was_running = not thread.is_alive()
        if was_running:
            self._sample(final=True)
        with self._lock:
            stats, self._stats = self._stats, {}
        self._drop(stats)
        _samplers.discard(self)

    def __enter__(self) -> SystemStats:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self.running else "stopped"
        return (
            f"<torchmon.SystemStats {state} source={self.source!r} "
            f"interval={self._interval:g}s stats={len(self._stats)}>"
        )

    # --- the thread ---

    def _run(self, stop: threading.Event) -> None:
        try:
            while not stop.wait(self._interval):
                self._sample()
        except BaseException as exc:  # nothing may escape into the program
            report_unraisable(exc, self, "Exception ignored in torchmon.SystemStats' thread")

    def _drop(self, stats: dict[str, Stat]) -> None:
        """Destroys the Stats, which emits their open windows; a handler's
        error is reported, not raised (close() runs at exit too)."""
        while stats:
            _, stat = stats.popitem()
            try:
                del stat
            except Exception as exc:
                report_unraisable(exc, self, "Exception ignored in a handler of SystemStats")

    def _failed(self, what: str, exc: BaseException, *, expected: bool = False) -> None:
        """One log line per failing source for the sampler's lifetime."""
        if what in self._logged:
            return
        self._logged.add(what)
        level = logging.INFO if expected else logging.WARNING
        _log.log(level, "torchmon.SystemStats: no %s figures: %s", what, exc)

    def _sample(self, final: bool = False) -> dict[str, float]:
        with self._lock:
            if self._closed and not final:
                return {}
            values: dict[str, float] = {}
            now = time.monotonic()
            readers: list[tuple[str, Callable[[dict[str, float], float], None]]] = [
                ("process", self._read_process),
                ("system CPU", self._read_host_cpu),
                ("system memory", self._read_host_memory),
            ]
            if self._io:
                readers += [("disk", self._read_disk), ("network", self._read_network)]
            if self._gpu:
                readers += [("NVML GPU", self._read_nvml), ("torch CUDA", self._read_torch_cuda)]
            for what, read in readers:
                try:
                    read(values, now)
                except Exception as exc:
                    self._failed(what, exc)
            stats = self._stats
            adds = []
            for name, value in values.items():
                stat = stats.get(name)
                if stat is None:
                    stat = stats[name] = Stat(name, _aggregations(name), self._window_size)
                adds.append((stat, value))
        # Outside the lock: an add that closes a window runs the handlers,
        # which may look at this sampler.
        for stat, value in adds:
            try:
                stat.add(value)
            except Exception as exc:
                report_unraisable(exc, stat, "Exception ignored in a handler of SystemStats")
        return values

    def _rate(self, key: str, now: float, counters: tuple[float, ...]) -> tuple[float, ...] | None:
        """The change of ``counters`` since their previous reading, divided by
        the seconds elapsed; None at the first reading."""
        previous = self._last.get(key)
        self._last[key] = (now, *counters)
        if previous is None:
            return None
        seconds = now - previous[0]
        if seconds <= 0.0:
            return None
        return tuple((c - p) / seconds for c, p in zip(counters, previous[1:]))

    def _read_process(self, values: dict[str, float], now: float) -> None:
        reader = self._reader
        # CLOCK_PROCESS_CPUTIME_ID, not the clock ticks of times(2) or psutil:
        # a tick (10 ms) is 4% of a CPU at a 0.25 s interval, so a mostly idle
        # process read as exactly 0 in every sample.
        cpu = self._rate("process.cpu", now, (time.process_time(),))
        if cpu is not None:
            values["process.cpu.utilization"] = max(0.0, cpu[0]) / self._ncpu
        rss, threads = reader.process_memory()
        values["process.memory.usage"] = float(rss)
        values["process.thread.count"] = float(threads)

    def _read_host_cpu(self, values: dict[str, float], now: float) -> None:
        busy, total = self._reader.host_cpu()
        previous = self._last.get("system.cpu")
        if previous is not None and total <= previous[1]:
            return  # not one clock tick since (10 ms): wait for a longer stretch
        self._last["system.cpu"] = (busy, total)
        if previous is not None:
            share = (busy - previous[0]) / (total - previous[1])
            values["system.cpu.utilization"] = min(1.0, max(0.0, share))

    def _read_host_memory(self, values: dict[str, float], now: float) -> None:
        total, available, swap_total, swap_free = self._reader.host_memory()
        used = total - available
        values["system.memory.usage"] = float(used)
        values["system.memory.utilization"] = used / total
        if swap_total > 0:  # no swap: no figure
            values["system.paging.utilization"] = (swap_total - swap_free) / swap_total

    def _read_disk(self, values: dict[str, float], now: float) -> None:
        rates = self._rate("disk", now, self._reader.disk_bytes())
        if rates is not None:
            values["system.disk.io.read"] = max(0.0, rates[0])
            values["system.disk.io.write"] = max(0.0, rates[1])

    def _read_network(self, values: dict[str, float], now: float) -> None:
        rates = self._rate("network", now, self._reader.network_bytes())
        if rates is not None:
            values["system.network.io.receive"] = max(0.0, rates[0])
            values["system.network.io.transmit"] = max(0.0, rates[1])

    def _read_nvml(self, values: dict[str, float], now: float) -> None:
        if self._nvml is None:
            self._nvml = []  # tried once: a failure here is logged once, not retried
            self._nvml_module, self._nvml = _open_nvml(self._failed)
        nvml = self._nvml_module
        for ordinal, handle in self._nvml:
            prefix = f"hw.gpu.{ordinal}."
            for name, read in (
                ("utilization", lambda h: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
                ("memory.usage", lambda h: float(nvml.nvmlDeviceGetMemoryInfo(h).used)),
                ("memory.limit", lambda h: float(nvml.nvmlDeviceGetMemoryInfo(h).total)),
                ("power", lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),  # mW
                ("power.limit", lambda h: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
                (
                    "temperature",
                    lambda h: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                ),
            ):
                try:
                    values[prefix + name] = read(handle)
                except Exception as exc:  # NotSupported on this GPU, say
                    self._failed(prefix + name, exc, expected=True)

    def _read_torch_cuda(self, values: dict[str, float], now: float) -> None:
        # Never imported nor initialised here: a CUDA context made by this
        # thread would take memory on a GPU the program may not use.
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return
        for device in range(cuda.device_count()):
            stats = cuda.memory_stats(device)
            if not stats:
                continue
            prefix = f"torch.cuda.{device}."
            for name, key in _TORCH_CUDA_STATS:
                if key in stats:
                    values[prefix + name] = float(stats[key])


_TORCH_CUDA_STATS = (
    ("memory.allocated", "allocated_bytes.all.current"),
    ("memory.allocated.peak", "allocated_bytes.all.peak"),
    ("memory.reserved", "reserved_bytes.all.current"),
    ("memory.reserved.peak", "reserved_bytes.all.peak"),
    ("alloc_retries", "num_alloc_retries"),
    ("ooms", "num_ooms"),
)


def _aggregations(name: str) -> tuple[Aggregation, ...]:
    if name.endswith(".utilization"):
        return _UTILIZATION
    if name.startswith(("system.disk.io.", "system.network.io.")):
        return _RATE
    if name.endswith((".limit", ".peak", ".alloc_retries", ".ooms")):
        return _LAST
    return _LEVEL


def _visible_gpus(nvml: Any) -> list[tuple[int, Any]]:
    """(CUDA ordinal, NVML handle) of each GPU of this rank: the ones
    CUDA_VISIBLE_DEVICES names (indices or UUIDs), in its order; else, when
    torchrun gave each rank of the node one GPU (as many ranks as GPUs),
    GPU LOCAL_RANK, the one such a rank uses by convention; else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        from ._rank import rank_info

        count = nvml.nvmlDeviceGetCount()
        rank = rank_info()
        if rank.local_world_size > 1 and rank.local_world_size == count:
            return [(rank.local_rank, nvml.nvmlDeviceGetHandleByIndex(rank.local_rank))]
        return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    found = []
    for ordinal, item in enumerate(x.strip() for x in visible.split(",")):
        if not item:
            break
        if item.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(item))
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(item)
        found.append((ordinal, handle))
    return found


def _open_nvml(failed: Callable[..., None]) -> tuple[Any, list[tuple[int, Any]]]:
    try:
        import pynvml  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        failed("NVML GPU", ImportError("nvidia-ml-py (pynvml) is not installed"), expected=True)
        return None, []
    try:
        pynvml.nvmlInit()
        gpus = _visible_gpus(pynvml)
    except Exception as exc:  # no driver, no GPU, no permission
        failed("NVML GPU", exc, expected=True)
        return None, []
    if not gpus:
        failed("NVML GPU", LookupError("NVML sees no GPU for this process"), expected=True)
    return pynvml, gpus


def _interval_seconds(interval: object) -> float:
    if isinstance(interval, timedelta):
        seconds = interval.total_seconds()
    elif isinstance(interval, (int, float)) and not isinstance(interval, bool):
        seconds = float(interval)
    else:
        raise arg_type_error(
            "SystemStats", "interval", "a datetime.timedelta or a number of seconds", interval
        )
    if not 0.0 < seconds < float("inf"):
        raise arg_value_error(
            "SystemStats", "interval", f"must be a positive, finite time, got {interval!r}"
        )
    if seconds > threading.TIMEOUT_MAX:
        # The sampler waits `interval` with Event.wait, which raises
        # OverflowError above this bound: on its thread, which would die.
        raise arg_value_error(
            "SystemStats",
            "interval",
            f"must be at most threading.TIMEOUT_MAX ({threading.TIMEOUT_MAX:g} s), "
            f"got {interval!r}",
        )
    return seconds


def _after_fork_in_child() -> None:  # a step of torchmon/_lifecycle.py
    # The parent's thread does not exist here: the sampler is stopped, and
    # start() in the child begins afresh (its own CPU time, its own NVML).
    for sampler in list(_samplers):
        sampler._thread = None
        sampler._stop = threading.Event()
        sampler._pid = os.getpid()
        sampler._reset_baselines()
        try:
            sampler._reader.after_fork()
        except Exception as exc:  # psutil cannot read this process: /proc can
            sampler._failed("psutil in the forked child", exc)
            sampler._reader = _ProcReader()


def _close_all_at_exit() -> None:
    # Closed before the exit flush (torchmon/_lifecycle.py; docs/reliability.md,
    # "Nothing lost at exit"): the last sample lands in the windows that the
    # close emits.
    for sampler in list(_samplers):
        if sampler.running:
            try:
                sampler.close()
            except BaseException as exc:
                report_unraisable(exc, sampler, "Exception ignored in SystemStats' exit close")
