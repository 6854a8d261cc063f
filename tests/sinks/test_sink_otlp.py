"""OpenTelemetryEventHandler pushing over OTLP/HTTP to real receivers on
loopback (docs/sinks.md, "OpenTelemetry"): gauges and the exponential
histograms of distributions arrive with exact values and bucket counts, and
each rank's attributes and service.instance.id (docs/guide.md, "OTLP push").

Two receivers: oteltap (an embeddable OTLP/HTTP receiver that tests can
await metrics from) for the points, and a minimal one written here with
http.server and opentelemetry-proto for the multi-rank test, because oteltap
hands out each Metric without the resource it came with, where
service.instance.id lives.
"""

from __future__ import annotations

import asyncio
import gzip
import math
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, Callable

import pytest

import torchmon
from torchmon import Aggregation, OpenTelemetryEventHandler, Stat
from torchmon.testing import ManualClock

pytest.importorskip("opentelemetry.sdk.metrics")
pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    reason="the OTLP/HTTP exporter (the otlp extra) is not installed",
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

RANK_ENV = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "job42",
}


# --- the contract's exact bucket index (docs/api.md), independent of torchmon


def scale6_index(x: float) -> int:
    """OpenTelemetry's scale-6 bucket of |x|: 2**(i/64) < |x| <= 2**((i+1)/64),
    from |x| = m / 2**s exactly and m**64's bit length."""
    m, d = Fraction(abs(x)).as_integer_ratio()
    s = 0
    while d > 1:  # d is a power of two
        d //= 2
        s += 1
    p = m**64
    index = (p.bit_length() - 1) - 64 * s
    if m & (m - 1) == 0:
        index -= 1
    return index


def buckets_of(values: Iterable[float], shift: int = 0) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        i = scale6_index(v) >> shift  # floor: bucket i of scale 6 lies in i >> shift
        counts[i] = counts.get(i, 0) + 1
    return counts


def distribution_of(samples: Sequence[float]) -> torchmon.Distribution:
    """A window's histogram built by hand from its samples (torch's rules for
    SUM/MIN/MAX: NaN propagates through sum; min/max of the finite ones are
    enough for the samples used here)."""
    finite = [x for x in samples if math.isfinite(x)]
    return torchmon.Distribution(
        count=len(samples),
        sum=sum(samples) if samples else 0.0,
        min=min(samples) if samples else 0.0,
        max=max(samples) if samples else 0.0,
        zero_count=sum(1 for x in finite if x == 0),
        nan_count=sum(1 for x in samples if math.isnan(x)),
        positive_inf_count=sum(1 for x in samples if x == math.inf),
        negative_inf_count=sum(1 for x in samples if x == -math.inf),
        positive=sorted(buckets_of(x for x in finite if x > 0).items()),
        negative=sorted(buckets_of(-x for x in finite if x < 0).items()),
    )


def window_event(name: str, samples: Sequence[float]) -> Any:
    """A Stat window event of a Stat with P50 (what the handler reads:
    name, data, distribution)."""
    dist = distribution_of(samples)
    return SimpleNamespace(
        name=torchmon.STAT_EVENT,
        timestamp=datetime.now(),
        data={f"{name}.count": len(samples), f"{name}.p50": dist.quantile(0.5)},
        distribution=dist,
    )


def dense(counts: dict[int, int]) -> tuple[int, list[int]]:
    if not counts:
        return 0, []
    low = min(counts)
    return low, [counts.get(i, 0) for i in range(low, max(counts) + 1)]


# --- oteltap


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def attributes_of(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def through_oteltap(
    push: Callable[[str], None], wanted: Sequence[Callable[[Metric], bool]]
) -> list[Metric]:
    """Starts oteltap on a free loopback port, runs ``push(endpoint)`` in a
    thread, and returns the first metric matching each predicate (30 s at
    most each); stops the receiver."""
    oteltap = pytest.importorskip("oteltap", reason="oteltap (Python >= 3.10) is not installed")

    async def session() -> list[Metric]:
        port = free_port()
        settings = oteltap.OtelTapHttpProtobufReceiverSettings(http_port=port)
        async with oteltap.OtelTapHttpProtobufReceiver(settings) as receiver:
            waits = [asyncio.ensure_future(receiver.await_metric(p, timeout=30)) for p in wanted]
            await asyncio.sleep(0)  # the awaiters are registered before anything is sent
            await asyncio.to_thread(push, f"http://127.0.0.1:{port}/v1/metrics")
            return list(await asyncio.gather(*waits))

    return asyncio.run(session())


def named(name: str, count: int | None = None) -> Callable[[Metric], bool]:
    def match(metric: Metric) -> bool:
        if metric.name != name:
            return False
        if count is None:
            return True
        return any(p.count == count for p in metric.exponential_histogram.data_points)

    return match


@pytest.fixture
def rank3(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in RANK_ENV.items():
        monkeypatch.setenv(key, value)


def test_gauges_and_histogram_arrive_exact(rank3: None) -> None:
    samples_1 = [0.001, 0.25, 1.0, 1.5, 2.0, 3.0, 1024.0, 1e6, -0.5, -8.0, 0.0, 0.0]
    samples_2 = [0.3, 0.3, 7.0, -0.5, 2.0**-1074, 1.7976931348623157e308]

    def push(endpoint: str) -> None:
        with ManualClock(0) as clock:
            sink = OpenTelemetryEventHandler.otlp(
                endpoint, export_interval=math.inf, attributes={"run": "t1"}, max_buckets=1 << 20
            )
            handle = torchmon.register_event_handler(sink)
            try:
                loss = Stat("train.loss", [Aggregation.SUM, Aggregation.COUNT], 1.0)
                for v in (0.5, 0.25, 0.125):
                    loss.add(v)
                clock.advance(1000)
                loss.add(1.0)  # closes the window: sum 0.875 over 3 samples
                sink(window_event("train.step_time", samples_1))
                sink(window_event("train.step_time", samples_2))
            finally:
                torchmon.unregister_event_handler(handle)
                sink.close()  # exports once more, then shuts the exporter down

    loss_sum, loss_count, hist = through_oteltap(
        push,
        [named("train.loss.sum"), named("train.loss.count"), named("train.step_time")],
    )
    expected_attributes = {
        "rank": "3",
        "local_rank": "1",
        "node": "1",
        "job": "job42",
        "run": "t1",
    }
    (point,) = loss_sum.gauge.data_points
    assert point.as_double == 0.875
    assert attributes_of(point.attributes) == expected_attributes
    assert loss_count.gauge.data_points[0].as_double == 3.0

    (point,) = hist.exponential_histogram.data_points
    assert hist.exponential_histogram.aggregation_temporality == 2  # CUMULATIVE
    everything = samples_1 + samples_2
    assert point.scale == 6
    assert point.count == len(everything)
    assert point.zero_count == 2
    assert point.sum == sum(samples_1) + sum(samples_2)
    assert point.min == -8.0
    assert point.max == 1.7976931348623157e308
    assert point.zero_threshold == 0.0
    offset, counts = dense(buckets_of(x for x in everything if x > 0))
    assert (point.positive.offset, list(point.positive.bucket_counts)) == (offset, counts)
    offset, counts = dense(buckets_of(-x for x in everything if x < 0))
    assert (point.negative.offset, list(point.negative.bucket_counts)) == (offset, counts)
    # The boundaries: 1.0 and 2.0 close buckets -1 and 63, 1.5 is inside bucket 37.
    assert point.positive.bucket_counts[-1 - point.positive.offset] == 1
    assert point.positive.bucket_counts[63 - point.positive.offset] == 1
    assert attributes_of(point.attributes) == expected_attributes
    assert point.start_time_unix_nano < point.time_unix_nano


def test_real_stat_windows_end_to_end(rank3: None) -> None:
    """A Stat with P50/P99 through the registry: each closed window's
    distribution is merged into the cumulative point, bucket counts equal to
    the oracle's over every sample, sum exact, p99 gauge present."""
    windows = [
        [0.010, 0.012, 0.011, 0.250, 0.013],
        [0.009, 0.014, 1.5, 0.011],
        [2.0**-3, 3.0, 0.0, -1.0],
    ]

    def push(endpoint: str) -> None:
        with ManualClock(0) as clock:
            # 8.4 octaves, 537 buckets: kept at scale 6 (downscaling is tested below).
            sink = OpenTelemetryEventHandler.otlp(
                endpoint, export_interval=math.inf, max_buckets=1000
            )
            handle = torchmon.register_event_handler(sink)
            try:
                step = Stat(
                    "train.step_time",
                    [Aggregation.COUNT, Aggregation.SUM, torchmon.P50, torchmon.P99],
                    1.0,
                )
                for samples in windows:
                    for v in samples:
                        step.add(v)
                    clock.advance(1000)
                step.add(0.5)  # closes the third window; this one stays open
            finally:
                torchmon.unregister_event_handler(handle)
                sink.close()

    hist, p99 = through_oteltap(push, [named("train.step_time", 13), named("train.step_time.p99")])
    # The last window's p99: rank ceil(0.99 * 4) = 4 of 4 is its MAX, exactly.
    assert p99.gauge.data_points[0].as_double == 3.0
    (point,) = hist.exponential_histogram.data_points
    everything = [x for w in windows for x in w]
    assert point.scale == 6
    assert point.count == 13
    assert point.zero_count == 1
    assert point.sum == sum(sum(w) for w in windows)
    assert (point.min, point.max) == (-1.0, 3.0)
    assert (point.positive.offset, list(point.positive.bucket_counts)) == dense(
        buckets_of(x for x in everything if x > 0)
    )
    assert (point.negative.offset, list(point.negative.bucket_counts)) == dense(
        buckets_of(-x for x in everything if x < 0)
    )


def test_downscaled_to_max_buckets(rank3: None) -> None:
    """Samples over nine decades need ~1900 buckets at scale 6: with
    max_buckets=40 the point is at the largest scale whose span fits, the
    counts merged exactly."""
    samples = [10.0 ** (k / 7) for k in range(-21, 43)] + [-(10.0 ** (k / 3)) for k in range(-3, 4)]

    def push(endpoint: str) -> None:
        sink = OpenTelemetryEventHandler.otlp(endpoint, export_interval=math.inf, max_buckets=40)
        sink(window_event("lat", samples))
        sink.close()

    (metric,) = through_oteltap(push, [named("lat")])
    (point,) = metric.exponential_histogram.data_points
    positive = [x for x in samples if x > 0]
    negative = [-x for x in samples if x < 0]

    def span(values: list[float], shift: int) -> int:
        b = buckets_of(values, shift)
        return max(b) - min(b) + 1

    shift = 6 - point.scale
    assert shift > 0
    assert span(positive, shift) <= 40 and span(negative, shift) <= 40
    assert span(positive, shift - 1) > 40 or span(negative, shift - 1) > 40
    assert (point.positive.offset, list(point.positive.bucket_counts)) == dense(
        buckets_of(positive, shift)
    )
    assert (point.negative.offset, list(point.negative.bucket_counts)) == dense(
        buckets_of(negative, shift)
    )
    assert point.count == len(samples)


@pytest.mark.parametrize("scale", [None, 5])
def test_a_fixed_scale_keeps_a_series_bounds_across_exports(rank3: None, scale: int | None) -> None:
    """Cumulative: the second export holds both windows. By default its range
    (two octaves, then nine decades) lowers the scale to fit max_buckets, so
    the bucket bounds change between the exports; with ``scale=5`` both
    points are at scale 5 with every bucket their range needs."""
    narrow = [1.0 + k / 100 for k in range(50)]
    wide = [10.0 ** (k / 7) for k in range(-21, 43)]

    def push(endpoint: str) -> None:
        sink = OpenTelemetryEventHandler.otlp(endpoint, export_interval=math.inf, scale=scale)
        sink(window_event("lat", narrow))
        assert sink.flush()
        sink(window_event("lat", wide))
        sink.close()

    first, second = through_oteltap(
        push, [named("lat", len(narrow)), named("lat", len(narrow) + len(wide))]
    )
    (point1,) = first.exponential_histogram.data_points
    (point2,) = second.exponential_histogram.data_points
    if scale is None:
        assert point1.scale == 6 and point2.scale < 6
        assert len(point2.positive.bucket_counts) <= 160
    else:
        assert point1.scale == point2.scale == scale
        for point, samples in ((point1, narrow), (point2, narrow + wide)):
            assert (point.positive.offset, list(point.positive.bucket_counts)) == dense(
                buckets_of(samples, 6 - scale)
            )
        assert len(point2.positive.bucket_counts) > 160  # max_buckets does not apply


def test_nan_and_infinities_left_out(rank3: None) -> None:
    """NaN and ±inf have no bucket: not counted; sum, min and max, which they
    spoilt, are left out of the point (optional in OTLP)."""
    clean = [1.0, 2.0, 3.0]
    spoilt = [4.0, math.nan, math.inf, -math.inf, 0.0]

    def push(endpoint: str) -> None:
        sink = OpenTelemetryEventHandler.otlp(endpoint, export_interval=math.inf)
        sink(window_event("clean", clean))
        sink(window_event("mixed", clean))
        sink(window_event("mixed", spoilt))
        sink(window_event("pinf", [5.0, math.inf]))
        sink.close()

    clean_m, mixed_m, pinf_m = through_oteltap(
        push, [named("clean"), named("mixed"), named("pinf")]
    )
    (point,) = clean_m.exponential_histogram.data_points
    assert (point.count, point.sum, point.min, point.max) == (3, 6.0, 1.0, 3.0)
    (point,) = mixed_m.exponential_histogram.data_points
    assert point.count == 5  # 1, 2, 3, 4 and the zero
    assert point.zero_count == 1
    assert not point.HasField("sum")
    assert not point.HasField("min") and not point.HasField("max")
    assert dense(buckets_of([1.0, 2.0, 3.0, 4.0])) == (
        point.positive.offset,
        list(point.positive.bucket_counts),
    )
    (point,) = pinf_m.exponential_histogram.data_points
    # +inf spoils the sum and max only: the window's MIN is its finite minimum.
    assert point.count == 1 and point.min == 5.0
    assert not point.HasField("sum") and not point.HasField("max")


def test_cumulative_then_delta(rank3: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cumulative (the OTLP exporter's default): each export holds every
    window so far with one start time. Delta (the exporter's temporality
    preference): each export holds the windows since the previous one."""
    first, second = [1.0, 2.0], [3.0, 3.0, 3.0]

    def push(endpoint: str) -> None:
        sink = OpenTelemetryEventHandler.otlp(endpoint, export_interval=math.inf)
        sink(window_event("c", first))
        sink.flush()
        sink(window_event("c", second))
        sink.close()

    one, both = through_oteltap(push, [named("c", 2), named("c", 5)])
    (p1,) = one.exponential_histogram.data_points
    (p2,) = both.exponential_histogram.data_points
    assert p1.start_time_unix_nano == p2.start_time_unix_nano
    assert (p1.sum, p2.sum) == (3.0, 12.0)
    assert dense(buckets_of(first + second)) == (
        p2.positive.offset,
        list(p2.positive.bucket_counts),
    )

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    one, other = through_oteltap(push, [named("c", 2), named("c", 3)])
    (p1,) = one.exponential_histogram.data_points
    (p2,) = other.exponential_histogram.data_points
    assert one.exponential_histogram.aggregation_temporality == 1  # DELTA
    assert p2.start_time_unix_nano == p1.time_unix_nano
    assert (p2.sum, p2.min, p2.max) == (9.0, 3.0, 3.0)
    assert dense(buckets_of(second)) == (p2.positive.offset, list(p2.positive.bucket_counts))


# --- several ranks, one receiver that keeps the resources


@contextmanager
def request_receiver() -> Iterator[tuple[str, list[ExportMetricsServiceRequest]]]:
    requests: list[ExportMetricsServiceRequest] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            requests.append(ExportMetricsServiceRequest.FromString(body))
            reply = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/metrics", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# No close(): at exit, torchmon's exit flush emits the open window and the
# handler's exit hook exports it (docs/sinks.md, "Own exporter").
RANK_SCRIPT = """
import sys, torchmon
from torchmon import Aggregation, Stat

sink = torchmon.OpenTelemetryEventHandler.otlp(sys.argv[1], export_interval=float("inf"))
torchmon.register_event_handler(sink)
samples = Stat("samples", [Aggregation.SUM], 3600.0)
samples.add(float(sys.argv[2]))
"""


def test_each_rank_has_its_instance_id_and_rank_attributes() -> None:
    """Two ranks (child processes) push to one receiver; each exports its
    last window at exit."""
    with request_receiver() as (endpoint, requests):
        children = []
        for rank in range(2):
            env = {
                **os.environ,
                **RANK_ENV,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "GROUP_RANK": "0",
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
            }
            env.pop("OTEL_SERVICE_NAME", None)
            env.pop("OTEL_RESOURCE_ATTRIBUTES", None)
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", RANK_SCRIPT, endpoint, str(10 * (rank + 1))],
                    env=env,
                )
            )
        for child in children:
            assert child.wait(timeout=120) == 0
    seen: dict[str, tuple[dict[str, Any], dict[str, Any], float]] = {}
    for request in requests:
        for rm in request.resource_metrics:
            resource = attributes_of(rm.resource.attributes)
            for sm in rm.scope_metrics:
                assert sm.scope.name == "torchmon"
                for metric in sm.metrics:
                    if metric.name == "samples.sum":
                        (point,) = metric.gauge.data_points
                        seen[resource["service.instance.id"]] = (
                            resource,
                            attributes_of(point.attributes),
                            point.as_double,
                        )
    assert len(seen) == 2, seen
    by_rank = {attrs["rank"]: (resource, attrs, value) for resource, attrs, value in seen.values()}
    assert sorted(by_rank) == ["0", "1"]
    for rank, (resource, attrs, value) in by_rank.items():
        assert attrs == {"rank": rank, "local_rank": rank, "node": "0", "job": "job42"}
        assert value == 10.0 * (int(rank) + 1)
        assert resource["service.name"] == "torchmon"
        assert resource["service.instance.id"].split("/")[1] == f"rank{rank}"
        assert resource["host.name"] == socket.gethostname()


def test_resource_from_environment_and_arguments(
    rank3: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchmon's resource attributes are defaults: the OTEL_* variables
    override them, and resource_attributes override those."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,host.name=h1,service.instance.id=i1"
    )
    with request_receiver() as (endpoint, requests):
        sink = OpenTelemetryEventHandler.otlp(
            endpoint, export_interval=math.inf, resource_attributes={"host.name": "h2"}
        )
        sink(window_event("lat", [1.0]))
        sink.close()
    (request,) = requests
    (rm,) = request.resource_metrics
    resource = attributes_of(rm.resource.attributes)
    assert resource["service.name"] == "trainer"
    assert resource["deployment.environment"] == "ci"
    assert resource["service.instance.id"] == "i1"
    assert resource["host.name"] == "h2"


def test_torchmon_flush_exports_the_open_window(rank3: None) -> None:
    """torchmon.flush() emits the open window to the handler, then flushes
    the handler, which exports it (docs/sinks.md, "Own exporter")."""
    with request_receiver() as (endpoint, requests):
        sink = OpenTelemetryEventHandler.otlp(endpoint, export_interval=math.inf)
        handle = torchmon.register_event_handler(sink)
        try:
            loss = Stat("flushed", [Aggregation.SUM], 3600.0)
            loss.add(2.5)
            torchmon.flush()
            sent = list(requests)
        finally:
            torchmon.unregister_event_handler(handle)
            sink.close()
    values = [
        point.as_double
        for request in sent
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "flushed.sum"
        for point in metric.gauge.data_points
    ]
    assert values == [2.5]


# --- arguments


def test_meter_provider_mode_keeps_gauges_only() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        sink = OpenTelemetryEventHandler(meter_provider=provider)
        sink(window_event("lat", [1.0, 2.0]))
        data = reader.get_metrics_data()
        kinds = {
            m.name: type(m.data).__name__
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            if sm.scope.name == "torchmon"
            for m in sm.metrics
        }
        assert kinds == {"lat.count": "Gauge", "lat.p50": "Gauge"}
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"max_buckets": 2}, ValueError, "max_buckets"),
        ({"max_buckets": 4.0}, TypeError, "max_buckets"),
        ({"scale": 7}, ValueError, "scale"),
        ({"scale": -11}, ValueError, "scale"),
        ({"scale": 5.0}, TypeError, "scale"),
        ({"scale": True}, TypeError, "scale"),
        ({"export_interval": 0}, ValueError, "export_interval"),
        ({"export_interval": "1"}, TypeError, "export_interval"),
        ({"resource": {"a": 1}}, TypeError, "resource"),
        ({"exporter": object()}, TypeError, "exporter"),
    ],
)
def test_bad_exporter_arguments(
    kwargs: dict[str, Any], error: type[Exception], argument: str
) -> None:
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    args = {"exporter": ConsoleMetricExporter(), "export_interval": math.inf, **kwargs}
    with pytest.raises(error, match=rf"OpenTelemetryEventHandler\({argument}\)"):
        OpenTelemetryEventHandler(**args)


def test_exporter_and_meter_provider_exclusive() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    provider = MeterProvider(shutdown_on_exit=False)
    with pytest.raises(ValueError, match=r"OpenTelemetryEventHandler\(exporter\)"):
        OpenTelemetryEventHandler(meter_provider=provider, exporter=ConsoleMetricExporter())
    with pytest.raises(ValueError, match=r"OpenTelemetryEventHandler\(export_interval\)"):
        OpenTelemetryEventHandler(meter_provider=provider, export_interval=5.0)
    with pytest.raises(ValueError, match=r"OpenTelemetryEventHandler\(scale\)"):
        OpenTelemetryEventHandler(meter_provider=provider, scale=5)
    provider.shutdown()


def test_otlp_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"otlp\(endpoint\)"):
        OpenTelemetryEventHandler.otlp(4318)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"otlp\(headers\)"):
        OpenTelemetryEventHandler.otlp(headers={"a": 1})  # type: ignore[dict-item]
