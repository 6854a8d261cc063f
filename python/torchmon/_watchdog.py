"""``torchmon.Watchdog``: which rank hangs and where, and which rank is slow
(docs/watchdog.md).

The hang clock, the stack dump and the beat-age gauge are the core's
(crates/torchmon-core/src/watchdog.rs), which needs no GIL; this module
checks the arguments, registers faulthandler for the dump signal, turns the
core's reports into Events (with torch's flight recorder and wait counters
beside the dump), and runs the reporter thread: every ``report_interval``
it cuts each section's window, publishes this rank's section p50s and beat
state through the c10d store (never a collective: the job is what hangs),
and records the straggler scores.
"""

from __future__ import annotations

import errno
import faulthandler
import json
import math
import os
import signal
import socket
import struct
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from datetime import datetime, timedelta

from ._core import (
    Aggregation,
    Event,
    Stat,
    _set_stack_dumper,
    _signal_is_taken,
    _Watchdog,
    log_event,
)
from ._errors import (
    arg_type_error,
    arg_value_error,
    check_int,
    check_optional_seconds,
    check_seconds,
    report_unraisable,
)
from ._forksafe import new_lock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

_CALL = "Watchdog"

#: The signal whose faulthandler registration writes the stacks of a hang,
#: unless ``dump_signal`` names another: a real-time signal, which schedulers
#: and frameworks leave alone (SLURM and Lightning use SIGUSR1/SIGUSR2).
DEFAULT_DUMP_SIGNAL = signal.SIGRTMAX - 2

#: The aggregations of a section's Stat ``section.<name>`` (seconds).
SECTION_AGGREGATIONS = (
    Aggregation.COUNT,
    Aggregation.MEAN,
    Aggregation.P50,
    Aggregation.P99,
    Aggregation.MAX,
)

#: Long enough that only the reporter's cut (every ``report_interval``) ends
#: a section's window.
_SECTION_WINDOW = timedelta(days=1)

_STORE_PREFIX = "torchmon/watchdog/"

#: The signals ``dump_signal`` refuses: those that end, stop, resume or
#: report on a process (a handler for SIGTERM would keep torchrun's SIGTERM
#: from ending the rank), and the fault signals faulthandler itself uses.
_REFUSED_DUMP_SIGNALS = frozenset(
    int(getattr(signal, name))
    for name in (
        "SIGABRT", "SIGALRM", "SIGBUS", "SIGCHLD", "SIGCONT", "SIGFPE", "SIGHUP", "SIGILL",
        "SIGINT", "SIGIO", "SIGKILL", "SIGPIPE", "SIGPROF", "SIGPWR", "SIGQUIT", "SIGSEGV",
        "SIGSTOP", "SIGSYS", "SIGTERM", "SIGTRAP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG",
        "SIGVTALRM", "SIGWINCH", "SIGXCPU", "SIGXFSZ",
    )
    if hasattr(signal, name)
)  # fmt: skip

#: A Stat's name is at most 200 characters; a section's is ``section.<name>``.
_SECTION_NAME_MAX = 200 - len("section.")

# The faulthandler registration: (signal, the descriptor it writes to), once
# per process; two watchdogs share it. A bare descriptor, not a file object:
# it stays open for the life of the process (no ResourceWarning at exit).
_dumper: tuple[int, int] | None = None
_dumper_lock = new_lock()
_live: weakref.WeakSet[Watchdog] = weakref.WeakSet()


def _register_stack_dumper(signum: int) -> None:
    global _dumper
    with _dumper_lock:
        if _dumper is not None and _dumper[0] == signum:
            return
        if signal.getsignal(signum) not in (signal.SIG_DFL, None) or _signal_is_taken(signum):
            raise arg_value_error(
                _CALL,
                "dump_signal",
                f"is signal {signum}, which already has a handler; the watchdog does not "
                "take it over: pass another signal",
            )
        fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            faulthandler.register(signum, file=fd, all_threads=True, chain=False)
        except (OSError, RuntimeError, ValueError) as exc:
            os.close(fd)
            raise arg_value_error(
                _CALL, "dump_signal", f"is signal {signum}, which cannot be handled: {exc}"
            ) from None
        _set_stack_dumper(signum, fd)
        if _dumper is not None:
            faulthandler.unregister(_dumper[0])
            os.close(_dumper[1])
        _dumper = (signum, fd)


def _distributed() -> Any:
    """torch.distributed when it was imported and initialised (never imports it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:
        return None


class Watchdog(_Watchdog):
    """Reports a rank whose steps stopped, with every thread's stack, and
    scores each section against the other ranks (docs/watchdog.md).

    ``beat()`` marks a step done; ``with wd.section(name):`` times a part of
    a step into the Stat ``section.<name>``; ``with wd.paused():`` stops the
    clock (a checkpoint). The timeout is ``max(min_timeout, factor * p99 of
    the recent beat intervals)``, at most ``max_timeout``; before
    ``warmup_beats`` beats (the first steps compile) it is ``first_timeout``
    (default: 10 x ``min_timeout``, at least 300 s).
    """

    def __init__(
        self,
        min_timeout: float = 10.0,
        factor: float = 5.0,
        *,
        max_timeout: float | None = None,
        first_timeout: float | None = None,
        warmup_beats: int = 2,
        dump_dir: str | os.PathLike[str] | None = "torchmon-hangs",
        exit_code: int | None = None,
        report_interval: float = 10.0,
        dump_signal: int | None = None,
        store: Any = None,
    ) -> None:
        min_timeout_s = check_seconds(_CALL, "min_timeout", min_timeout, finite=True)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise arg_type_error(_CALL, "factor", "a number", factor)
        max_timeout_s = check_optional_seconds(_CALL, "max_timeout", max_timeout, finite=True)
        first_timeout_s = check_optional_seconds(_CALL, "first_timeout", first_timeout, finite=True)
        check_int(_CALL, "warmup_beats", warmup_beats, low=0, high=2**63 - 1)
        if dump_dir is not None and not isinstance(dump_dir, (str, os.PathLike)):
            raise arg_type_error(_CALL, "dump_dir", "a path or None", dump_dir)
        if exit_code is not None:
            check_int(_CALL, "exit_code", exit_code, low=0, high=255, expected="an int or None")
        interval = check_seconds(_CALL, "report_interval", report_interval, finite=True)
        if dump_signal is not None:
            check_int(
                _CALL,
                "dump_signal",
                dump_signal,
                low=1,
                high=signal.NSIG - 1,
                expected="a signal number or None",
            )
            if int(dump_signal) in _REFUSED_DUMP_SIGNALS:
                raise arg_value_error(
                    _CALL,
                    "dump_signal",
                    f"is {signal.Signals(dump_signal).name}, which ends, stops or reports on "
                    "a process: pass SIGUSR1, SIGUSR2 or a real-time signal (docs/watchdog.md, "
                    '"The dump signal")',
                )
        from ._rank import rank_info

        info = rank_info()
        self._rank = info.rank
        self._world_size = info.world_size
        self._exit_code = exit_code
        self._report_interval = interval
        self._store = store
        self._link: _StoreLink | None = None
        self._link_lock = new_lock()
        self._store_failures = 0
        self._store_retry_at = 0.0
        self._best_p50: dict[str, float] = {}
        self._straggler_stats: dict[str, Stat] = {}
        self._stopped_ranks: tuple[int, ...] = ()
        # Rank 0's view of each rank's entry: its tick, and when (rank 0's
        # monotonic clock) that tick was first read.
        self._entry_seen: dict[int, tuple[Any, float]] = {}
        self._pid = os.getpid()
        self._stop_reporter = threading.Event()
        if dump_dir is not None:
            _register_stack_dumper(DEFAULT_DUMP_SIGNAL if dump_signal is None else int(dump_signal))
        ref = weakref.ref(self)

        def callback(
            kind: str, stalled_s: float, timeout_s: float, section: str, dump: str, beats: int
        ) -> None:
            watchdog = ref()
            if watchdog is not None:
                watchdog._report(kind, stalled_s, timeout_s, section, dump, beats)

        self._start(
            min_timeout_s,
            float(factor),
            max_timeout_s,
            first_timeout_s,
            warmup_beats,
            exit_code,
            self._rank,
            None if dump_dir is None else os.fspath(dump_dir),
            callback,
        )
        _live.add(self)
        self._reporter = threading.Thread(
            target=_report_loop, args=(ref, interval), name="torchmon-watchdog-report", daemon=True
        )
        self._reporter.start()

    # -- what the user calls besides beat() and section() (native) ----------

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No hang is reported inside: the clock stops, and restarts at the end."""
        self._pause()
        try:
            yield
        finally:
            self._resume()

    def close(self) -> None:
        """Stops the watchdog's threads (a report in progress finishes first);
        idempotent. The sections' Stats go on as any Stat (their open windows
        are emitted by ``torchmon.flush()``, at exit or when they are
        destroyed). In a forked child,
        whose copy has no thread, it only marks the copy closed: it touches
        no lock the parent's threads may have held at the fork."""
        self._stop()
        if os.getpid() != self._pid:
            return
        self._stop_reporter.set()
        with self._link_lock:
            link, self._link = self._link, None
        if link is not None:
            # A call to a hung store would keep the reporter past this
            # close, and a reporter that returns from torch's C++ while the
            # interpreter ends aborts the process: its connection is shut
            # down, so the call raises now (docs/watchdog.md, "A store that
            # hangs or dies").
            link.shut_down()
        reporter = self._reporter
        if reporter is not threading.current_thread():
            reporter.join(timeout=5.0)

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"timeout={self.timeout:.1f}s"
        return f"torchmon.Watchdog(rank={self._rank}, beats={self.beats}, {state})"

    # -- called by the native base ------------------------------------------

    def _section_stat(self, name: str) -> Stat:
        _check_section_name(name)
        try:
            return Stat(f"section.{name}", list(SECTION_AGGREGATIONS), _SECTION_WINDOW)
        except (TypeError, ValueError) as exc:
            # Stat's own refusal names Stat(name), which the caller never wrote.
            raise arg_value_error("Watchdog.section", "name", f"is refused: {exc}") from None

    def _report(
        self, kind: str, stalled_s: float, timeout_s: float, section: str, dump: str, beats: int
    ) -> None:
        """On the watchdog's thread: a hang (after its stack dump) or a resumption."""
        if os.getpid() != self._pid:
            return
        data: dict[str, Any] = {"rank": self._rank, "stalled_s": stalled_s, "beats": beats}
        if kind == "hang":
            if dump:
                self._dump_torch_state(dump)
            data.update(section=section, dump=dump, timeout_s=timeout_s)
            if self._stopped_ranks:
                data["stopped_ranks"] = ",".join(map(str, self._stopped_ranks))
        name = "torchmon.hang" if kind == "hang" else "torchmon.resumed"
        try:
            log_event(Event(name, datetime.now(), data))
        except BaseException as exc:
            report_unraisable(exc, self, f"torchmon.Watchdog: a handler of {name} raised")
        if kind == "hang" and self._exit_code is not None:
            from ._flush import flush

            flush(timeout=5.0)
            print(
                f"torchmon: rank {self._rank} made no step for {stalled_s:.1f} s; exiting with "
                f"code {self._exit_code} (dump: {dump or 'none'})",
                file=sys.stderr,
                flush=True,
            )
            os._exit(self._exit_code)

    def _dump_torch_state(self, dump: str) -> None:
        """Beside the stacks: torch's flight recorder and wait counters, when
        torch.distributed is initialised."""
        if _distributed() is None:
            return
        base = dump[: -len(".txt")] if dump.endswith(".txt") else dump
        for suffix, handler in (
            (".flight-recorder.json", "fr_trace_json"),
            (".wait-counters.json", "wait_counter_values"),
        ):
            path = base + suffix
            try:
                text = _control_plane(handler)
                if text is not None:
                    _write_new_file(path, text)
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno in (errno.EEXIST, errno.ELOOP):
                    problem = "a file or symlink is already there (left as it is)"
                else:
                    problem = str(exc)
                print(f"torchmon: the watchdog could not write {path}: {problem}", file=sys.stderr)

    # -- the reporter thread's steps ----------------------------------------

    def _report_tick(self, tick: int) -> None:
        p50s: dict[str, float] = {}
        for section in self._sections().values():
            window = section.stat._flush_window()
            if window is not None:
                p50s[section.stat.name[len("section.") :]] = window[f"{section.stat.name}.p50"]
        entry = {
            "rank": self._rank,
            "tick": tick,
            "time": time.time(),
            "beats": self.beats,
            "since_beat": self.seconds_since_beat,
            "timeout": self.timeout,
            "section": self._open_section,
            "p50": p50s,
        }
        # The individual score needs no other rank: recorded first, and so
        # also while the store is down.
        for name, p50 in p50s.items():
            if p50 > 0:
                best = self._best_p50[name] = min(self._best_p50.get(name, p50), p50)
                self._record_score(f"straggler.{name}.individual", min(1.0, best / p50))
        entries = self._exchange_or_note(entry)
        if entries is None:
            return
        for name, p50 in p50s.items():
            if not p50 > 0:
                continue
            fastest = min(
                (
                    e["p50"][name]
                    for e in entries
                    if e.get("tick") == tick and e["p50"].get(name, 0) > 0
                ),
                default=p50,
            )
            self._record_score(f"straggler.{name}.relative", min(1.0, fastest / p50))
        if self._rank == 0 and len(entries) > 1:
            self._check_stopped_ranks(entries)

    def _exchange_or_note(self, entry: dict[str, Any]) -> list[dict[str, Any]] | None:
        """``_exchange``, or None when the store failed: one line on stderr
        when an outage starts and one when it ends, not one per tick (every
        rank sees the same outage)."""
        if self._store_failures and time.monotonic() < self._store_retry_at:
            # A try at a dead store can take the call's bound: not at every
            # tick, so that the reports (the individual scores) keep their pace.
            return None
        try:
            entries = self._exchange(entry)
        except Exception as exc:
            if self._stop_reporter.is_set():
                return None  # closed during the call: its connection was shut down
            self._store_failures += 1
            self._store_retry_at = time.monotonic() + _store_timeout(self._report_interval)
            if self._store_failures == 1:
                first = str(exc).strip().splitlines()[:1] or [""]
                print(
                    f"torchmon: rank {self._rank}'s watchdog cannot reach the c10d store "
                    f"({type(exc).__name__}: {first[0][:200]}); it retries every report "
                    "and says when the store answers again",
                    file=sys.stderr,
                    flush=True,
                )
            return None
        if self._store_failures:
            print(
                f"torchmon: rank {self._rank}'s watchdog reaches the c10d store again, "
                f"after {self._store_failures} failed report(s)",
                file=sys.stderr,
                flush=True,
            )
            self._store_failures = 0
        return entries

    def _record_score(self, name: str, score: float) -> None:
        stat = self._straggler_stats.get(name)
        if stat is None:
            window = timedelta(seconds=max(self._report_interval, 0.001))
            stat = self._straggler_stats[name] = Stat(name, [Aggregation.VALUE], window)
        stat.add(score)
        stat._flush_window()

    def _exchange(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        """Publishes this rank's entry and reads every rank's, through the
        c10d store (never a collective); only this rank's without one."""
        store = self._store
        world_size = self._world_size
        if store is None:
            dist = _distributed()
            if dist is None:
                return [entry]
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
            world_size = dist.get_world_size()
        with self._link_lock:
            if self._stop_reporter.is_set():
                return [entry]
            link = self._link
            if link is None or link.origin is not store:
                link = self._link = _StoreLink(store, _store_timeout(self._report_interval))
        try:
            return self._exchange_through(link.client(), world_size, entry)
        except Exception:
            link.drop()
            raise

    def _exchange_through(
        self, store: Any, world_size: int, entry: dict[str, Any]
    ) -> list[dict[str, Any]]:
        store.set(f"{_STORE_PREFIX}{self._rank}", json.dumps(entry))
        # Every rank publishes at the same wall-clock tick, give or take its
        # cut: the entries of this tick are read until all are there or for
        # min(1 s, interval / 5); a rank whose entry is missing (not started
        # yet) or of an older tick (its reporter is late) is left out of this
        # tick rather than compared across two windows.
        wait = min(1.0, self._report_interval / 5)
        deadline = time.monotonic() + wait
        found: dict[int, dict[str, Any]] = {self._rank: entry}
        stale: dict[int, dict[str, Any]] = {}
        while True:
            if self._stop_reporter.wait(min(max(0.05, wait / 4), wait)):
                return [entry]
            missing = [rank for rank in range(world_size) if rank not in found]
            for rank, other in zip(missing, _read_entries(store, missing)):
                if other is None:
                    continue
                if other.get("tick") == entry["tick"]:
                    found[rank] = other
                else:
                    stale[rank] = other
            if len(found) == world_size or time.monotonic() >= deadline:
                break
        # The stale entries still tell rank 0 which ranks stopped beating.
        return [found.get(rank) or stale[rank] for rank in sorted({*found, *stale})]

    def _check_stopped_ranks(self, entries: list[dict[str, Any]]) -> None:
        # An entry's age is how long ago rank 0 first read its tick, on rank
        # 0's own monotonic clock: the entry's wall-clock "time" is the other
        # host's clock, and hosts' clocks differ by seconds.
        now = time.monotonic()
        seen = self._entry_seen
        for e in entries:
            known = seen.get(e["rank"])
            if known is None or known[0] != e.get("tick"):
                seen[e["rank"]] = (e.get("tick"), now)
        stale = 3 * self._report_interval
        stopped = tuple(
            sorted(
                e["rank"]
                for e in entries
                if e["since_beat"] + (now - seen[e["rank"]][1]) > e["timeout"]
                or now - seen[e["rank"]][1] > stale + e["timeout"]
            )
        )
        if stopped != self._stopped_ranks:
            self._stopped_ranks = stopped
            if stopped:
                sections = ",".join(
                    f"{e['rank']}:{e['section']}" for e in entries if e["rank"] in stopped
                )
                data: dict[str, str | int] = {
                    "ranks": ",".join(map(str, stopped)),
                    "count": len(stopped),
                    "sections": sections,
                    "suspects": ",".join(map(str, _odd_ones_out(entries, stopped))),
                }
                log_event(Event("torchmon.stopped_ranks", datetime.now(), data))


def _check_section_name(name: object) -> None:
    """A section's name becomes a Stat's name, a field of the hang's Event
    and of the store entry: a non-empty printable str."""
    call = "Watchdog.section"
    if not isinstance(name, str):
        raise arg_type_error(call, "name", "a str", name)
    if not name.strip():
        raise arg_value_error(call, "name", f"must not be empty or blank, got {name!r}")
    if not name.isprintable():
        raise arg_value_error(
            call, "name", f"must be printable (no control character), got {name!r}"
        )
    if len(name) > _SECTION_NAME_MAX:
        raise arg_value_error(
            call,
            "name",
            f"must be at most {_SECTION_NAME_MAX} characters (the Stat section.<name> at most "
            f"200), got {len(name)}",
        )


def _odd_ones_out(entries: list[dict[str, Any]], stopped: tuple[int, ...]) -> list[int]:
    """The stopped ranks whose step count or open section differ from those
    of most stopped ranks: when one rank hangs, the others block in the next
    collective, all in the same section at the same step, so the one that
    differs is where to look. Empty without a strict majority."""
    places = {e["rank"]: (e["beats"], e["section"]) for e in entries if e["rank"] in stopped}
    counts: dict[tuple[int, str], int] = {}
    for place in places.values():
        counts[place] = counts.get(place, 0) + 1
    common, count = max(counts.items(), key=lambda item: item[1], default=(None, 0))
    if count * 2 <= len(places):
        return []
    return sorted(rank for rank, place in places.items() if place != common)


def _store_timeout(interval: float) -> float:
    """The bound of one call of the reporter to the store: the report
    interval, from 2 to 10 s (a healthy store answers in milliseconds; a
    large job's reads take longer)."""
    return min(max(interval, 2.0), 10.0)


def _store_port(store: Any) -> int | None:
    """The port of the TCPStore under ``store`` (PrefixStores unwrapped),
    None for another kind of store."""
    for _ in range(32):
        port = getattr(store, "port", None)
        if isinstance(port, int) and hasattr(store, "host"):
            return port
        inner = getattr(store, "underlying_store", None)
        if inner is None or inner is store:
            return None
        store = inner
    return None


def _sockets() -> dict[int, str]:
    """This process's socket descriptors, each with its inode
    (``socket:[N]``): which ones a call opened, even if a number was reused."""
    found: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found[int(name)] = target
    return found


def _peer_port(fd: int) -> int | None:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        return int(sock.getpeername()[1])
    except (OSError, IndexError, TypeError, ValueError):
        return None
    finally:
        sock.close()


class _StoreLink:
    """The reporter's own connection to the store: a ``clone()`` of it
    (torch's way to use a store from another thread), whose calls are bounded
    by ``timeout`` (the store's ``set_timeout`` for its waits, the socket's
    receive and send timeouts for the rest: a TCPStore reads an answer with
    no bound of its own), and which ``shut_down()`` ends from another thread.

    Without ``clone`` (a store object of the user's) or where the
    connection's socket cannot be found (no TCPStore under it, no /proc), the
    store itself is used, unbounded, as before."""

    def __init__(self, origin: Any, timeout: float) -> None:
        self.origin = origin
        self._timeout = timeout
        self._port = _store_port(origin) if hasattr(origin, "clone") else None
        self._template: Any = None  # a clone whose clones inherit the short timeout
        self._client: Any = None
        self._fds: list[tuple[int, str]] = []
        self._cloning_since: dict[int, str] | None = None
        self._closed = False
        self._lock = new_lock()

    def client(self) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("the watchdog is closed")
            if self._port is None:
                return self.origin
            if self._client is not None:
                return self._client
            source = self._template if self._template is not None else self.origin
            before = self._cloning_since = _sockets()
        try:
            client = source.clone()
        finally:
            with self._lock:
                self._cloning_since = None
        fds = _new_sockets_to(before, self._port)
        if len(fds) != 1:
            # Another thread connected to the store meanwhile (the process
            # group's own client): which socket is the clone's is not known,
            # and a bound or a shutdown of the other would break the job's
            # store. This clone goes unbounded, as a store without clone().
            fds = []
        client.set_timeout(timedelta(seconds=self._timeout))
        seconds = int(self._timeout)
        limit = struct.pack("ll", seconds, int((self._timeout - seconds) * 1e6))
        for fd, _ in fds:
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        with self._lock:
            if self._closed:
                _shut(fds)
                raise RuntimeError("the watchdog is closed")
            if self._template is None:
                # Later connections are cloned from this one, whose timeout
                # bounds their connect too (the origin's is torch's 300 s).
                self._template = client
            self._client, self._fds = client, fds
            return client

    def drop(self) -> None:
        """After a failed call: the connection may be out of step with its
        answers (a late answer would be read as the next one's), so the next
        call makes a new one."""
        with self._lock:
            self._client, self._fds = None, []

    def shut_down(self) -> None:
        """Ends the connection under a call in progress, which raises at
        once, and refuses later calls; also a connection being opened (the
        sockets to the store's port made since its clone began)."""
        with self._lock:
            self._closed = True
            fds = list(self._fds)
            if self._cloning_since is not None and self._port is not None:
                opened = _new_sockets_to(self._cloning_since, self._port)
                if len(opened) == 1:
                    fds += opened
            _shut(fds)


def _new_sockets_to(before: dict[int, str], port: int | None) -> list[tuple[int, str]]:
    """The sockets to ``port`` opened since ``before`` (``_sockets()``),
    each with its inode."""
    return [
        (fd, inode)
        for fd, inode in _sockets().items()
        if before.get(fd) != inode and _peer_port(fd) == port
    ]


def _shut(fds: list[tuple[int, str]]) -> None:
    """Shuts the sockets down, each only if its descriptor still holds the
    same socket (a closed clone's number may since name another one)."""
    for fd, inode in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != inode:
                continue
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _read_entries(store: Any, ranks: list[int]) -> list[dict[str, Any] | None]:
    """The entries of ``ranks`` (None where a rank published none yet): in
    two round trips to the store (``check`` then ``multi_get``) once every
    rank has published, so a tick costs the store a few requests per rank,
    not one per pair of ranks; key by key while some are missing, or with a
    store that has no ``multi_get``."""
    keys = [f"{_STORE_PREFIX}{rank}" for rank in ranks]
    if keys and hasattr(store, "multi_get") and store.check(keys):
        return [json.loads(value) for value in store.multi_get(keys)]
    return [json.loads(store.get(key)) if store.check([key]) else None for key in keys]


def _write_new_file(path: str, text: str) -> None:
    """Writes ``text`` to a file created at ``path``, never through what is
    there already: the dump directory may be shared and the names are
    predictable, so a file or symlink planted at ``path`` would otherwise
    receive the write (docs/watchdog.md, "What a hang writes"). Raises
    OSError (EEXIST, ELOOP) when ``path`` exists; nothing is written then."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)


def _report_loop(ref: weakref.ref[Watchdog], interval: float) -> None:
    """Every ``interval`` seconds of the wall clock (the same instants on
    every rank), one report; ends with the watchdog."""
    last = -1
    while True:
        watchdog = ref()
        if watchdog is None:
            return
        stop = watchdog._stop_reporter
        # Never the same tick twice: a wait that ends a little before the
        # instant (the monotonic clock the wait counts and the wall clock
        # drift apart) would otherwise cut a second, nearly empty window and
        # publish it over the first under the same tick.
        tick = max(last + 1, math.floor(time.time() / interval) + 1)
        del watchdog
        while (delay := tick * interval - time.time()) > 0:
            if stop.wait(delay):
                return
        last = tick
        watchdog = ref()
        if watchdog is None or watchdog.closed:
            return
        try:
            watchdog._report_tick(tick)
        except Exception as exc:
            report_unraisable(exc, watchdog, "torchmon.Watchdog: a report failed")
        del watchdog


def _control_plane(handler: str) -> str | None:
    """What torch's control-plane handler ``handler`` answers (the handlers
    its debug server serves: ``fr_trace_json``, ``wait_counter_values``),
    called in process; None where this torch has no such handler."""
    import torch  # only once torch.distributed is initialised

    c10d: Any = torch._C._distributed_c10d
    if handler not in getattr(c10d, "_get_handler_names", list)():
        return None

    class Request(c10d._Request):  # type: ignore[misc]
        def body(self) -> bytes:
            return b""

        def get_param(self, name: str) -> str:
            return ""

    class Response(c10d._Response):  # type: ignore[misc]
        content: str | bytes | None = None

        def set_content(self, content: str | bytes, content_type: str) -> None:
            self.content = content

        def set_status(self, status: int) -> None:
            pass

    response = Response()
    c10d._get_handler(handler)(Request(), response)
    content = response.content
    return content.decode("utf-8", "replace") if isinstance(content, bytes) else content


def _close_all() -> None:
    """At exit (python/torchmon/_lifecycle.py): every watchdog of this
    process stops, so that no report starts while the interpreter ends."""
    for watchdog in list(_live):
        try:
            watchdog.close()
        except Exception as exc:
            report_unraisable(exc, watchdog, "torchmon.Watchdog: closing at exit")
