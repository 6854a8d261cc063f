"""OpenTelemetryEventHandler against the real opentelemetry-sdk: Stat windows
driven through the registry, read back with the SDK's InMemoryMetricReader."""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from support import registered

import torchmon
from torchmon import Aggregation, Event, OpenTelemetryEventHandler, Stat
from torchmon.handlers.otel import otel_instrument_name
from torchmon.testing import ManualClock

pytest.importorskip("opentelemetry.sdk.metrics")
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData, ScopeMetrics

# metric name -> [(attributes, value)]
Points = dict[str, list[tuple[dict[str, Any], float]]]


@contextmanager
def sdk() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        yield provider, reader
    finally:
        provider.shutdown()


def scopes(data: MetricsData | None, scope: str = "torchmon") -> list[ScopeMetrics]:
    """The data's metrics of instrumentation scope `scope`; other scopes are left
    out (opentelemetry-sdk 1.41, the last for Python 3.9, adds its own
    "opentelemetry-sdk" scope, its reader's collection times, to every
    collection after the first)."""
    if data is None:
        return []
    return [sm for rm in data.resource_metrics for sm in rm.scope_metrics if sm.scope.name == scope]


def collect(reader: InMemoryMetricReader, scope: str = "torchmon") -> Points:
    return points_of(reader.get_metrics_data(), scope)


def points_of(data: MetricsData | None, scope: str = "torchmon") -> Points:
    points: Points = {}
    for sm in scopes(data, scope):
        for metric in sm.metrics:
            assert type(metric.data).__name__ == "Gauge", metric
            points[metric.name] = [
                (dict(dp.attributes or {}), dp.value) for dp in metric.data.data_points
            ]
    return points


def window(stat: Stat, clock: ManualClock, *values: float) -> None:
    for v in values:
        stat.add(v)
    clock.advance(1000)


def test_stat_windows_recorded_as_gauges() -> None:
    attributes = {"rank": 0, "job": "pretrain", "node": "n1"}
    with sdk() as (provider, reader):
        sink = OpenTelemetryEventHandler(meter_provider=provider, attributes=attributes)
        with registered(sink), ManualClock(0) as clock:
            loss = Stat("train.loss", [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT], 1.0)
            assert collect(reader) == {}
            window(loss, clock, 1.0, 2.0, 6.0)
            loss.add(0.5)  # closes the first window
            first = reader.get_metrics_data()
            assert points_of(first) == {
                "train.loss.mean": [(attributes, 3.0)],
                "train.loss.max": [(attributes, 6.0)],
                "train.loss.count": [(attributes, 3.0)],
            }
            clock.advance(1000)
            loss.add(0.25)  # closes the second: the gauges show the last window
            got = collect(reader)
            assert got["train.loss.mean"] == [(attributes, 0.5)]
            assert got["train.loss.count"] == [(attributes, 1.0)]
            del loss  # the destruction flush emits the third
            gc.collect()
            assert collect(reader)["train.loss.max"] == [(attributes, 0.25)]
        # Read from the first window's collection: opentelemetry-sdk 1.41 (the
        # last for Python 3.9) exports a gauge only at the first collection
        # after a set, where newer SDKs export its last value at every one.
        (scope_metrics,) = scopes(first, "torchmon")
        assert scope_metrics.scope.version == torchmon.__version__
        descriptions = {m.name: m.description for m in scope_metrics.metrics}
        assert descriptions["train.loss.mean"] == (
            "torchmon Stat 'train.loss', mean over the last closed window"
        )


def test_meter_name_and_no_attributes() -> None:
    with sdk() as (provider, reader):
        sink = OpenTelemetryEventHandler(meter_provider=provider, meter_name="my.trainer")
        with registered(sink):
            torchmon.log_event(Event(torchmon.STAT_EVENT, datetime.now(), {"x.sum": 2.5}))
        assert collect(reader, scope="my.trainer") == {"x.sum": [({}, 2.5)]}
        assert collect(reader) == {}


def test_two_ranks_one_provider() -> None:
    """Handlers with different attributes share the instruments: one series each."""
    with sdk() as (provider, reader):
        sinks = [
            OpenTelemetryEventHandler(meter_provider=provider, attributes={"rank": r})
            for r in (0, 1)
        ]
        for r, sink in enumerate(sinks):
            sink(Event(torchmon.STAT_EVENT, datetime.now(), {"loss.mean": 1.0 + r}))
        got = collect(reader)
    assert sorted(got["loss.mean"], key=lambda p: p[0]["rank"]) == [
        ({"rank": 0}, 1.0),
        ({"rank": 1}, 2.0),
    ]


def test_instrument_name_rules() -> None:
    assert otel_instrument_name("train.loss.mean") == "train.loss.mean"
    assert otel_instrument_name("a-b/c_d.max") == "a-b/c_d.max"
    assert otel_instrument_name("a b:c.sum") == "a_b_c.sum"
    assert otel_instrument_name("0loss.mean") == "torchmon.0loss.mean"
    assert otel_instrument_name("_x.min") == "torchmon._x.min"
    assert otel_instrument_name("éa.min") == "torchmon._a.min"
    assert otel_instrument_name("") == "torchmon."
    long = otel_instrument_name("a" * 300)
    assert len(long) == 255 and long.startswith("a" * 200)


def test_long_keys_keep_distinct_instruments_per_aggregation() -> None:
    """A Stat event of an over-long name (logged by hand, or from
    torch.monitor through the bridge: Stats themselves stop at 200
    characters) gets one instrument per aggregation, each at most 255
    characters and ending in its suffix, not one cut name shared by all
    (docs/sinks.md, "OpenTelemetry")."""
    stat = "layer." * 46 + "loss"  # 280 characters
    keys = [f"{stat}.mean", f"{stat}.max", f"{stat}.p99"]
    with sdk() as (provider, reader):
        sink = OpenTelemetryEventHandler(meter_provider=provider)
        for value in (1.0, 2.0):
            sink(Event(torchmon.STAT_EVENT, datetime.now(), {k: value for k in keys}))
        got = collect(reader)
    assert len(got) == 3
    for name, points in got.items():
        assert len(name) <= 255 and name.startswith("layer.layer.")
        assert points == [({}, 2.0)]
    assert sorted(name.rpartition(".")[2] for name in got) == ["max", "mean", "p99"]
    # Two keys that differ only past the cut get different names too.
    assert otel_instrument_name("b" * 300 + "1.mean") != otel_instrument_name("b" * 300 + "2.mean")


def test_unusual_names_reach_the_sdk() -> None:
    """Names the SDK would reject as they are get sanitised and are recorded."""
    keys = ["0 grad:norm.mean", "é.sum", "x" * 300 + ".max"]
    with sdk() as (provider, reader):
        sink = OpenTelemetryEventHandler(meter_provider=provider)
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {k: 1.0 for k in keys}))
        got = collect(reader)
    assert got == {otel_instrument_name(k): [({}, 1.0)] for k in keys}
    assert "torchmon.0_grad_norm.mean" in got


def test_non_finite_values_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    """OpenTelemetry gauges take no NaN or infinity: the handler skips them
    (the SDK would log a warning per value), and a gauge keeps its last value."""
    with sdk() as (provider, reader):
        sink = OpenTelemetryEventHandler(meter_provider=provider)
        with registered(sink), ManualClock(0) as clock:
            s = Stat("x", [Aggregation.SUM, Aggregation.MAX, Aggregation.MIN], 1.0)
            window(s, clock, 1.0, 2.0)
            window(s, clock, math.inf, -math.inf)  # closes window 1
            s.add(0.0)  # closes window 2: sum NaN, max inf, min -inf
            got = collect(reader)
            del s
            gc.collect()
            last = collect(reader)
    assert got == {"x.sum": [({}, 3.0)], "x.max": [({}, 2.0)], "x.min": [({}, 1.0)]}
    assert last == {"x.sum": [({}, 0.0)], "x.max": [({}, 0.0)], "x.min": [({}, 0.0)]}
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_other_events_and_non_numbers_are_ignored() -> None:
    with sdk() as (provider, reader):
        sink = OpenTelemetryEventHandler(meter_provider=provider)
        with registered(sink):
            torchmon.log_event(Event("train.epoch_end", datetime.now(), {"loss": 0.5}))
            torchmon.log_event(
                Event(torchmon.STAT_EVENT, datetime.now(), {"a.sum": 2, "s": "t", "b": False})
            )
        assert collect(reader) == {"a.sum": [({}, 2)]}


def test_case_insensitive_names() -> None:
    """The SDK exports names lower-cased; keys that differ only in case clash."""
    with sdk() as (provider, reader):
        sink = OpenTelemetryEventHandler(meter_provider=provider)
        event = Event(torchmon.STAT_EVENT, datetime.now(), {"Loss.sum": 1.0, "loss.sum": 2.0})
        with pytest.raises(ValueError, match=r"'Loss\.sum' and 'loss\.sum' both map"):
            sink(event)
        assert collect(reader) == {"loss.sum": [({}, 1.0)]}
        sink(Event(torchmon.STAT_EVENT, datetime.now(), {"Loss.sum": 5.0, "LR.max": 0.1}))
        assert collect(reader) == {"loss.sum": [({}, 5.0)], "lr.max": [({}, 0.1)]}


def test_global_meter_provider_by_default() -> None:
    """meter_provider=None records through the global provider, set even after
    the handler was created (in a subprocess: the global is set-once)."""
    code = (
        "import datetime, torchmon\n"
        "from opentelemetry import metrics\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "sink = torchmon.OpenTelemetryEventHandler(attributes={'rank': 2})\n"
        "reader = InMemoryMetricReader()\n"
        "metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
        "h = torchmon.register_event_handler(sink)\n"
        "s = torchmon.Stat('loss', [torchmon.MAX], 3600.0, 2)\n"
        "s.add(1.0); s.add(4.0)\n"
        "torchmon.unregister_event_handler(h)\n"
        "(sm,) = reader.get_metrics_data().resource_metrics[0].scope_metrics\n"
        "(m,) = sm.metrics\n"
        "(p,) = m.data.data_points\n"
        "print(sm.scope.name, m.name, dict(p.attributes), p.value)\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "torchmon loss.max {'rank': 2} 4.0"


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"meter_provider": object()}, TypeError, "meter_provider"),
        ({"meter_name": 1}, TypeError, "meter_name"),
        ({"meter_name": ""}, ValueError, "meter_name"),
        ({"attributes": [("rank", 0)]}, TypeError, "attributes"),
        ({"attributes": {1: 0}}, TypeError, "attributes"),
        ({"attributes": {"": 0}}, ValueError, "attributes"),
        ({"attributes": {"rank": None}}, TypeError, "attributes"),
        ({"attributes": {"rank": [0]}}, TypeError, "attributes"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], argument: str) -> None:
    with pytest.raises(error, match=rf"OpenTelemetryEventHandler\({argument}\)"):
        OpenTelemetryEventHandler(**kwargs)


def test_keyword_only() -> None:
    with sdk() as (provider, _):
        with pytest.raises(TypeError):
            OpenTelemetryEventHandler(provider)  # type: ignore[misc]


def test_missing_opentelemetry_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if not installed\n"
        "import torchmon\n"
        "try:\n"
        "    torchmon.OpenTelemetryEventHandler()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    # a command that works: torchmon itself is on no package index (docs/sinks.md)
    assert "pip install opentelemetry-sdk" in result.stdout
    assert "torchmon[" not in result.stdout


_FORK_SCRIPT = r'''
import datetime as dt, json, math, os, sys
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
import torchmon as m

OUT = sys.argv[1]

class FileExporter(MetricExporter):
    """Appends the pid and every point exported (a count or a value) to OUT."""
    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        points = [
            [metric.name, getattr(p, "count", None) or p.value]
            for rm in metrics_data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            for p in metric.data.data_points
        ]
        fd = os.open(OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (json.dumps({"pid": os.getpid(), "points": points}) + "\n").encode())
        os.close(fd)
        return MetricExportResult.SUCCESS
    def force_flush(self, timeout_millis=10_000):
        return True
    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass

m.register_event_handler(
    m.OpenTelemetryEventHandler(exporter=FileExporter(), export_interval=math.inf))
s = m.Stat("s", [m.COUNT, m.P50], dt.timedelta(hours=1))
for _ in range(500):
    s.add(1.0)
m.flush()  # the window reaches the handler, which exports it
# A window the handler holds unexported when the process forks: the exit
# has something new to send (and the child would have, if it exported).
t = m.Stat("t", [m.COUNT], dt.timedelta(hours=1), max_samples=1)
t.add(1.0)
pid = os.fork()
if pid == 0:
    s.add(2.0)
    sys.exit(0)  # an ordinary exit: the exit flush, then the handler's close
os.waitpid(pid, 0)
print(os.getpid())
'''


def test_a_forked_child_does_not_export_the_parents_data(tmp_path: Any) -> None:
    """docs/sinks.md, "OpenTelemetry": a handler with its own exporter,
    inherited through fork, exports nothing from the child, whose exit used
    to close it and send the parent's gauges and histograms a second time."""
    out = tmp_path / "exports.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    parent = int(result.stdout.split()[-1])
    exports = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["pid"] for e in exports] == [parent, parent]  # torchmon.flush(), then exit
    assert exports[0]["points"] == [["s.count", 500.0], ["s.p50", 1.0], ["s", 500]]
