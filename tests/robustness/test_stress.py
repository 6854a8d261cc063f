"""Concurrency stress (docs/reliability.md, "Ordering and delivery"): Python
threads adding to shared Stats while other threads register and unregister
handlers and log events, with handlers that do Python work and raise.

Every scenario runs in a fresh interpreter with a hard timeout, so a deadlock
fails the test instead of hanging CI. The child checks its own bookkeeping and
prints one JSON summary; the assertions below compare the numbers in it:

- every add is accounted for: for the Stats without ``max_samples``, the COUNTs
  of all emitted windows (the last one emitted when the Stat is destroyed at
  the end, docs/internals.md "Exit") add up to the number of adds, and the SUMs to the sum of the
  added values (integer-valued floats, so the sums are exact);
- with ``max_samples`` and a test clock moved in phases, the windows hold
  exactly ``min(max_samples, attempts)`` samples each: exactly the documented
  drops (docs/internals.md, window algorithm step 2);
- every handler registered for the whole run sees every event (the same
  multiset for each); a handler registered by a churning thread sees every
  ``log_event`` call that started after its registration returned and ended
  before its unregistration started, and nothing that started after its
  unregistration returned (docs/reliability.md, "Ordering and delivery");
- every exception raised by a handler is either re-raised to the caller of
  ``add``/``log_event`` (at most one per dispatch) or reported through
  ``sys.unraisablehook``: raised == caught + unraisable, exactly.

Sizes (threads x operations) are in each scenario's id and in ``SCENARIOS``.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from support import run_python

TIMEOUT = 90.0

_CHILD = r"""
import bisect, datetime as dt, gc, itertools, json, sys, threading, time
import torchmon as m
from torchmon.testing import ManualClock

P = json.loads(PARAMS)
sys.setswitchinterval(P.get("switch", 1e-5))  # many more thread switches than usual
TS = dt.datetime(2020, 1, 1)

class HandlerError(Exception):
    pass

failures = []        # anything unexpected, as strings: the test asserts it stays empty
unraisable = []      # type names of what reached sys.unraisablehook
raised = []          # one item per exception raised by a handler
caught = []          # one item per HandlerError caught by a caller
stamp = itertools.count()  # next(stamp) is atomic under the GIL: a global order of moments

def hook(args):
    unraisable.append(type(args.exc_value).__name__)
    if not isinstance(args.exc_value, HandlerError):
        failures.append("unraisable %r" % (args.exc_value,))
sys.unraisablehook = hook

def excepthook(args):
    failures.append("thread %s died: %r" % (args.thread.name, args.exc_value))
threading.excepthook = excepthook

def work(e):
    # some Python work in every handler, with a chance for a thread switch
    data = e.data
    json.dumps(data, sort_keys=True)
    return sum(range(len(data) + 10))

class WholeRun:
    # registered before the first add, unregistered after the Stats were destroyed
    def __init__(self):
        self.stat_events = []  # json of each Stat event's data
        self.log_ids = []
    def __call__(self, e):
        work(e)
        if e.name == m.STAT_EVENT:
            self.stat_events.append(json.dumps(e.data, sort_keys=True))
        else:
            self.log_ids.append(e.data["id"])

def whole_raiser(e):
    work(e)
    # raises for every third Stat event and every fifth logged event
    key = len(raised) + (e.data["id"] if "id" in e.data else 0)
    if (e.name == m.STAT_EVENT and key % 3 == 0) or ("id" in e.data and e.data["id"] % 5 == 0):
        raised.append(1)
        raise HandlerError("whole-run raiser")

first, last = WholeRun(), WholeRun()
whole_handles = [m.register_event_handler(first), m.register_event_handler(whole_raiser),
                 m.register_event_handler(last)]

stop = threading.Event()
registrations = []   # (seen ids, stamp after register returned, stamp before and after unregister)
logged = []          # (id, stamp before log_event, stamp after it returned)
log_ids = itertools.count()

def churner(k):
    n = 0
    while not stop.is_set() or n < P["min_churn"]:
        seen = []
        raises = (n % 4 == 0)
        def handler(e, seen=seen, raises=raises):
            work(e)
            if "id" in e.data:
                seen.append(e.data["id"])
            if raises:
                raised.append(1)
                raise HandlerError("churn raiser")
        h = m.register_event_handler(handler)
        r = next(stamp)
        if n % 2 == 0:
            log_one()
        time.sleep(0)
        u0 = next(stamp)
        m.unregister_event_handler(h)
        u1 = next(stamp)
        registrations.append((seen, r, u0, u1))
        n += 1

def log_one():
    i = next(log_ids)
    e = m.Event("ev", TS, {"id": i, "who": threading.current_thread().name})
    s0 = next(stamp)
    try:
        m.log_event(e)
    except HandlerError:
        caught.append(1)
    s1 = next(stamp)
    logged.append((i, s0, s1))

def logger():
    n = 0
    while not stop.is_set() or n < P["min_logs"]:
        log_one()
        n += 1

MODE = P["mode"]
W = P["window_ms"]
clock = ManualClock(0) if MODE != "real" else None
if clock is not None:
    clock.__enter__()

# name -> Stat; the adders reach them through this dict only, so that clearing
# it at the end destroys them (and emits their open windows).
STATS = {"free": m.Stat("free", [m.COUNT, m.SUM], dt.timedelta(milliseconds=W))}
if P["max_samples"]:
    STATS["capped"] = m.Stat("capped", [m.COUNT, m.SUM], dt.timedelta(milliseconds=W),
                             P["max_samples"])

totals = {name: [0, 0.0] for name in STATS}  # adds, sum of values (per thread, merged)
merge = threading.Lock()

ticks = [0]  # clock.advance calls made by the ticker (mode "manual")
CHECKPOINTS = 8

def wait_for_a_tick(seen):
    # The adds after this are in a later window than those before it, so
    # the windows roll during the run however the threads are scheduled.
    deadline = time.monotonic() + 60
    while ticks[0] <= seen and time.monotonic() < deadline:
        time.sleep(0.0005)

def add_many(n, value_of):
    local = {name: [0, 0.0] for name in STATS}
    for i in range(n):
        if MODE == "manual" and i and i % (n // CHECKPOINTS) == 0:
            wait_for_a_tick(ticks[0])
        for name, stat in STATS.items():
            v = value_of(i)
            try:
                stat.add(v)
            except HandlerError:
                caught.append(1)
            local[name][0] += 1
            local[name][1] += v
    with merge:
        for name, (n_, s_) in local.items():
            totals[name][0] += n_
            totals[name][1] += s_

phases = P.get("phases")
barrier = threading.Barrier(P["adders"] + 1) if phases else None

def adder(k):
    if phases:
        for phase, per_thread in enumerate(phases, start=1):
            barrier.wait(60)
            add_many(per_thread, lambda i, phase=phase: float(phase))
            barrier.wait(60)
    else:
        add_many(P["adds"], lambda i: float((i * 7 + k) % 11))

def ticker():
    # moves the test clock forward while the adders run (mode "manual")
    while not stop.is_set():
        clock.advance(P["tick_ms"])
        ticks[0] += 1
        time.sleep(0.0005)

threads = [threading.Thread(target=adder, args=(k,), name="adder%d" % k)
           for k in range(P["adders"])]
others = [threading.Thread(target=churner, args=(k,), name="churn%d" % k)
          for k in range(P["churners"])]
others += [threading.Thread(target=logger, name="log%d" % k) for k in range(P["loggers"])]
if MODE == "manual":
    others.append(threading.Thread(target=ticker, name="ticker"))
t0 = time.monotonic()
for t in threads + others:
    t.start()
if phases:
    for phase in range(1, len(phases) + 1):
        clock.set(phase * W)           # window `phase` (id = t // W + 1 == phase + 1)
        barrier.wait(60)               # the adders add ...
        barrier.wait(60)               # ... and are done with this phase
for t in threads:
    t.join(60)
stop.set()
for t in others:
    t.join(60)
alive = [t.name for t in threads + others if t.is_alive()]

open_counts = {name: stat.count for name, stat in STATS.items()}
emitted_before = len(first.stat_events)
STATS.clear()   # destroys the Stats: their open windows are emitted now
gc.collect()
final_events = first.stat_events[emitted_before:]
for h in whole_handles:
    m.unregister_event_handler(h)
if clock is not None:
    clock.__exit__(None, None, None)

# ---- the child's own bookkeeping ----
by_stat = {}
for data in map(json.loads, first.stat_events):
    (key,) = {k.split(".")[0] for k in data}
    by_stat.setdefault(key, []).append([data[key + ".count"], data[key + ".sum"]])

ids_logged = sorted(i for i, _, _ in logged)
# Calls ordered by their start stamp (stamps are unique), so that each
# registration looks only at the calls that started while it was registered:
# a scan of every call for every registration is quadratic, and on CPython 3.9
# and 3.10, where the churners get many more turns (about 20,000 registrations
# against 400 on 3.12), it took longer than the run itself, past the timeout.
by_start = sorted(logged, key=lambda call: call[1])
starts = [s0 for _, s0, _ in by_start]
start_of = {i: s0 for i, s0, _ in logged}
must_see = must_not_see = missed = extra = dup = 0
for seen, r, u0, u1 in registrations:
    if len(seen) != len(set(seen)):
        dup += 1
    seen = set(seen)
    # must see: started after r and returned before u0 (so started before u0)
    for i, s0, s1 in by_start[bisect.bisect_right(starts, r):bisect.bisect_left(starts, u0)]:
        if s1 < u0:
            must_see += 1
            if i not in seen:
                missed += 1
    # must not see: started after u1
    must_not_see += len(starts) - bisect.bisect_right(starts, u1)
    extra += sum(1 for i in seen if start_of.get(i, -1) > u1)

print(json.dumps({
    "failures": failures,
    "alive": alive,
    "seconds": time.monotonic() - t0,
    "totals": totals,
    "windows": by_stat,
    "open_counts": open_counts,
    "final_events": [json.loads(x) for x in final_events],
    "live_stats": m._core._live_stat_count(),
    "handlers_left": m._core._handler_count(),
    "first_equals_last_stat": sorted(first.stat_events) == sorted(last.stat_events),
    "first_log_ids_sorted": sorted(first.log_ids) == ids_logged,
    "last_log_ids_sorted": sorted(last.log_ids) == ids_logged,
    "n_logged": len(logged),
    "ids_are_0_to_n": ids_logged == list(range(len(logged))),
    "registrations": len(registrations),
    "must_see": must_see, "missed": missed,
    "must_not_see": must_not_see, "extra": extra, "duplicates": dup,
    "raised": len(raised), "caught": len(caught), "unraisable": len(unraisable),
}))
"""

#: id -> parameters. adders x adds (per Stat) + churners + loggers run together.
SCENARIOS: dict[str, dict[str, Any]] = {
    # real 1 ms windows: thousands of windows close during the run
    "real-1ms-4adders-x200000-2churn-2log": dict(
        mode="real",
        window_ms=1,
        adders=4,
        adds=200_000,
        churners=2,
        loggers=2,
        max_samples=0,
        min_churn=200,
        min_logs=500,
    ),
    # real 5 ms windows, 8 adder threads, and a second Stat capped at 25 samples
    "real-5ms-8adders-x50000-capped25-2churn-1log": dict(
        mode="real",
        window_ms=5,
        adders=8,
        adds=50_000,
        churners=2,
        loggers=1,
        max_samples=25,
        min_churn=200,
        min_logs=500,
    ),
    # test clock advanced by another thread every ~0.5 ms, 1 window per tick
    "manual-ticker-6adders-x100000-3churn-2log": dict(
        mode="manual",
        window_ms=10,
        tick_ms=10,
        adders=6,
        adds=100_000,
        churners=3,
        loggers=2,
        max_samples=0,
        min_churn=200,
        min_logs=500,
    ),
    # test clock moved in phases: exact max_samples drops per window
    "manual-phased-4adders-capped50-2churn-2log": dict(
        mode="phased",
        window_ms=100,
        adders=4,
        churners=2,
        loggers=2,
        max_samples=50,
        phases=[5, 13, 20, 12, 1, 40, 30, 2000, 7, 3000],
        min_churn=200,
        min_logs=500,
    ),
}


def run_scenario(params: dict[str, Any]) -> dict[str, Any]:
    code = f"PARAMS = {json.dumps(params)!r}\n" + _CHILD
    try:
        proc = run_python(code, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"deadlock? the stress child did not finish within {TIMEOUT}s")
    assert proc.returncode == 0, f"exit code {proc.returncode}\nstderr:\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("params", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_stress(params: dict[str, Any]) -> None:
    out = run_scenario(params)
    assert out["failures"] == []
    assert out["alive"] == []
    assert out["live_stats"] == 0
    assert out["handlers_left"] == 0

    # Every thread added what it was asked to.
    per_thread = sum(params["phases"]) if "phases" in params else params["adds"]
    adds = params["adders"] * per_thread
    for name, (n, _) in out["totals"].items():
        assert n == adds, name

    # The unbounded Stat: nothing lost, nothing counted twice.
    free = out["windows"]["free"]
    n_adds, value_sum = out["totals"]["free"]
    assert sum(c for c, _ in free) == n_adds
    assert sum(s for _, s in free) == value_sum
    assert all(c >= 1 for c, _ in free)
    # windows actually rolled during the run (more than the final flush): in
    # mode "manual" each adder waits for a tick at 7 checkpoints
    assert len(free) == len(params["phases"]) if "phases" in params else len(free) > 5
    # The final flush emitted exactly the open windows.
    finals = {next(iter(d)).split(".")[0]: d for d in out["final_events"]}
    for name, open_count in out["open_counts"].items():
        if open_count:
            assert finals[name][f"{name}.count"] == open_count
        else:
            assert name not in finals

    if params["max_samples"]:
        capped = out["windows"]["capped"]
        cap = params["max_samples"]
        assert all(1 <= c <= cap for c, _ in capped)
        if "phases" in params:
            # phase k adds the value k, adders x phases[k-1] times, in window k
            expected = []
            for k, per in enumerate(params["phases"], start=1):
                accepted = min(cap, params["adders"] * per)
                expected.append([accepted, float(k * accepted)])
            assert sorted(capped, key=lambda w: w[1] / w[0]) == expected
            # the unbounded Stat got one window per phase, nothing dropped
            assert sorted(free, key=lambda w: w[1] / w[0]) == [
                [params["adders"] * per, float(k * params["adders"] * per)]
                for k, per in enumerate(params["phases"], start=1)
            ]
        else:
            accepted = sum(c for c, _ in capped)
            assert accepted <= out["totals"]["capped"][0]
            # same values as the unbounded Stat, but capped windows can only lose samples
            assert sum(s for _, s in capped) <= out["totals"]["capped"][1]

    # Handlers registered for the whole run saw every event.
    assert out["first_equals_last_stat"]
    assert out["ids_are_0_to_n"]
    assert out["first_log_ids_sorted"]
    assert out["last_log_ids_sorted"]
    assert out["n_logged"] >= params["loggers"] * params["min_logs"]

    # Churned handlers: seen while registered, never started after unregister.
    assert out["registrations"] >= params["churners"] * params["min_churn"]
    assert out["must_see"] > 0
    assert out["missed"] == 0
    assert out["extra"] == 0
    assert out["duplicates"] == 0

    # Every handler exception went somewhere, exactly once.
    assert out["raised"] > 0
    assert out["raised"] == out["caught"] + out["unraisable"]
