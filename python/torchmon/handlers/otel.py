"""OpenTelemetry sink: Stat windows become synchronous gauges, and the
distributions of Stats with P aggregations exponential histograms
(needs ``pip install opentelemetry-sdk``; OTLP push also
``opentelemetry-exporter-otlp-proto-http``). See docs/sinks.md.

``opentelemetry`` is imported when a handler is created, never by
``import torchmon``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Union

from .._core import STAT_EVENT, Event
from .._errors import (
    arg_message,
    arg_type_error,
    arg_value_error,
    check_int,
    check_optional_seconds,
)
from .._flush import _flush_local_sinks, _register_flushable
from .._forksafe import new_lock
from ._common import (
    ClosesAtExit,
    check_mapping,
    require,
    set_numeric_values,
    shortened,
    stat_description,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.metrics import _Gauge as Gauge  # public only under this name
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import (
        ExponentialHistogramDataPoint,
        Metric,
        MetricExporter,
        MetricsData,
    )
    from opentelemetry.sdk.resources import Resource

    from .._core import Distribution

__all__ = ["OpenTelemetryEventHandler", "otel_instrument_name"]

_AttributeValue = Union[str, bool, int, float]

# What the argument errors name (the one format: python/torchmon/_errors.py).
_OWNER = "OpenTelemetryEventHandler"
_OTLP = "OpenTelemetryEventHandler.otlp"

_INVALID_INSTRUMENT_CHAR = re.compile(r"[^-_./a-zA-Z0-9]")
_MAX_INSTRUMENT_NAME = 255


def otel_instrument_name(key: str) -> str:
    """The instrument name for a Stat event key: ``"train.loss.mean"`` stays as is.

    OpenTelemetry instrument names are ``[a-zA-Z][-_./a-zA-Z0-9]{0,254}``:
    any other character (a space, a ``:``, any non-ASCII character) becomes
    ``_``; a name that does not start with an ASCII letter is prefixed with
    ``torchmon.``. A name longer than 255 characters keeps its last
    ``.<suffix>`` (the aggregation: ``.mean``, ``.p99``) and the start of the
    rest, joined by ``-`` and 8 hex digits of the key's SHA-256, so that
    every key keeps its own instrument (Stat names stop at 200 characters;
    such keys come from events logged by hand or from torch.monitor).
    """
    name = _INVALID_INSTRUMENT_CHAR.sub("_", key)
    if not name or not ("a" <= name[0] <= "z" or "A" <= name[0] <= "Z"):
        name = "torchmon." + name
    return shortened(name, key, _MAX_INSTRUMENT_NAME)


_P_SUFFIXES = frozenset(("p50", "p90", "p95", "p99", "p999"))

DEFAULT_MAX_BUCKETS = 160  # the OpenTelemetry SDK's default max_size
# The scales a fixed-scale handler may ask for: OpenTelemetry's smallest, up
# to the core's (histogram buckets are kept at scale 6).
MIN_SCALE, MAX_SCALE = -10, 6
# max_buckets for a fixed scale: no limit (above any dense range's length).
_UNBOUNDED = 2**64 - 1
# How long flush() and close() (so the process exit) wait for the exporter,
# retries included (docs/sinks.md, "Unreachable collector"): a preempted job
# has about 30 s between SIGTERM and SIGKILL.
DEFAULT_EXPORT_TIMEOUT = 5.0
# export_interval=math.inf: the reader still gets its thread, so that the
# last export at close() runs there and close() can stop waiting for it.
# About 3 years, below threading.TIMEOUT_MAX.
_NEVER_MS = 1e11


def _stat_name(data: Mapping[str, object]) -> str | None:
    """The Stat's name of a window event that carries a distribution: the
    prefix of its ``<name>.p50``-like keys (such a Stat has at least one)."""
    for key in data:
        name, _, suffix = key.rpartition(".")
        if name and suffix in _P_SUFFIXES:
            return name
    return None


class _Histogram:
    """The windows of one Stat merged at scale 6, as one OpenTelemetry
    exponential histogram point holds them (docs/sinks.md, "OpenTelemetry").

    NaN and the infinities have no bucket: they are left out of the buckets
    and of ``count``. A window that had any leaves the point's ``sum`` unknown
    from then on (the window's SUM is NaN or infinite, and the sum of its
    finite samples was not kept); likewise ``min`` after a window whose MIN is
    not a finite value of a NaN-free window, and ``max``.
    """

    __slots__ = ("buckets", "max", "min", "sum")

    def __init__(self) -> None:
        # Every window merged; only its buckets are read (the point's sum,
        # min and max follow the rules above, not Distribution.merge's).
        self.buckets: Distribution | None = None
        self.sum: float | None = 0.0
        # inf / -inf: no finite sample yet; None: unknown.
        self.min: float | None = math.inf
        self.max: float | None = -math.inf

    def add(self, distribution: Distribution) -> None:
        merged = self.buckets
        self.buckets = distribution if merged is None else merged.merge(distribution)
        non_finite = (
            distribution.nan_count
            + distribution.positive_inf_count
            + distribution.negative_inf_count
        )
        total = float(distribution.sum)
        if self.sum is not None:
            self.sum = self.sum + total if non_finite == 0 and math.isfinite(total) else None
        if distribution.count == non_finite:
            return  # min and max of no finite sample: nothing to combine
        low, high = float(distribution.min), float(distribution.max)
        known = distribution.nan_count == 0
        if self.min is not None:
            self.min = min(self.min, low) if known and math.isfinite(low) else None
        if self.max is not None:
            self.max = max(self.max, high) if known and math.isfinite(high) else None

    def point(
        self,
        attributes: Mapping[str, _AttributeValue],
        start_ns: int,
        now_ns: int,
        max_buckets: int,
        fixed_scale: int | None,
    ) -> ExponentialHistogramDataPoint:
        from opentelemetry.sdk.metrics.export import Buckets, ExponentialHistogramDataPoint

        assert self.buckets is not None  # made by add()
        # Downscaled to at most max_buckets per sign, or to the handler's
        # fixed scale with every bucket the range needs (docs/sinks.md,
        # "OpenTelemetry", Downscaling).
        if fixed_scale is None:
            exponential = self.buckets._exponential(max_buckets)
        else:
            exponential = self.buckets._exponential(_UNBOUNDED, fixed_scale)
        scale, positive_offset, positive, negative_offset, negative = exponential
        # The SDK's point class types sum, min and max as floats, but its
        # OTLP encoder leaves a None out (they are optional fields of the
        # protocol): that is how an unknown value is sent. min stays inf and
        # max -inf while no finite sample arrived: none to report.
        low: Any = self.min if self.min is not None and math.isfinite(self.min) else None
        high: Any = self.max if self.max is not None and math.isfinite(self.max) else None
        return ExponentialHistogramDataPoint(
            attributes=dict(attributes),
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            count=self.buckets.zero_count + sum(positive) + sum(negative),
            sum=self.sum,  # type: ignore[arg-type]
            scale=scale,
            zero_count=self.buckets.zero_count,
            positive=Buckets(offset=positive_offset, bucket_counts=positive),
            negative=Buckets(offset=negative_offset, bucket_counts=negative),
            flags=0,
            min=low,
            max=high,
        )


def _check_attribute_key(key: str) -> None:
    if not key:
        raise arg_value_error(_OWNER, "attributes", "must not have an empty key")


def _check_attributes(attributes: object) -> dict[str, _AttributeValue]:
    return check_mapping(
        attributes,
        "OpenTelemetryEventHandler",
        "attributes",
        expected="str keys to str/bool/int/float values",
        key_noun="keys",
        check_key=_check_attribute_key,
        value_types=(str, bool, int, float),
        value_text="a str, bool, int or float",
    )


def _rank_identity() -> tuple[dict[str, str], dict[str, str]]:
    """(point attributes, resource attributes) of this rank for ``otlp()``:
    the Prometheus sink's labels (``RankInfo.labels()``: rank, local_rank,
    node, job) on every point, and a ``service.instance.id`` distinct per
    process in the resource."""
    from .._rank import rank_info

    info = rank_info()
    # The pid tells apart two jobs' rank 0 on one host, and a restarted rank
    # (a new cumulative series) from its predecessor.
    resource = {
        "service.instance.id": f"{info.host}/rank{info.rank}/pid{os.getpid()}",
        "host.name": info.host,
    }
    return info.labels(), resource


class _Histograms:
    """The exponential histograms of a handler that owns its exporter: one
    per (Stat name) series, added to every collection of its reader."""

    __slots__ = (
        "_attributes",
        "_delta",
        "_histograms",
        "_lock",
        "_max_buckets",
        "_resource",
        "_scale",
        "_scope",
        "_start_ns",
    )

    def __init__(
        self,
        *,
        scope: Any,
        resource: Resource,
        attributes: Mapping[str, _AttributeValue],
        max_buckets: int,
        scale: int | None,
        delta: bool,
    ) -> None:
        self._scope = scope
        self._resource = resource
        self._attributes = dict(attributes)
        self._max_buckets = max_buckets
        self._scale = scale
        self._delta = delta
        # name -> (description, histogram); a delta collection empties it.
        self._histograms: dict[str, tuple[str, _Histogram]] = {}
        self._start_ns = time.time_ns()
        self._lock = new_lock()

    def add(self, name: str, description: str, distribution: Distribution) -> None:
        with self._lock:
            entry = self._histograms.get(name)
            if entry is None:
                entry = self._histograms[name] = (description, _Histogram())
            entry[1].add(distribution)

    def metrics(self) -> list[Metric]:
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality,
            ExponentialHistogram,
            Metric,
        )

        now = time.time_ns()
        with self._lock:
            taken = list(self._histograms.items())
            start = self._start_ns
            if self._delta:
                self._histograms = {}
                self._start_ns = now
        temporality = (
            AggregationTemporality.DELTA if self._delta else AggregationTemporality.CUMULATIVE
        )
        return [
            Metric(
                name=name,
                description=description,
                unit="",
                data=ExponentialHistogram(
                    data_points=[
                        histogram.point(
                            self._attributes, start, now, self._max_buckets, self._scale
                        )
                    ],
                    aggregation_temporality=temporality,
                ),
            )
            for name, (description, histogram) in taken
        ]

    def attach(self, data: MetricsData) -> MetricsData:
        """``data`` (a collection of the handler's provider) with the
        histograms in the handler's scope."""
        from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics

        metrics = self.metrics()
        if not metrics:
            return data
        resources = list(data.resource_metrics) or [
            ResourceMetrics(resource=self._resource, scope_metrics=[], schema_url="")
        ]
        first = resources[0]
        scopes = list(first.scope_metrics)
        for i, scope_metrics in enumerate(scopes):
            if scope_metrics.scope == self._scope:
                scopes[i] = ScopeMetrics(
                    scope=scope_metrics.scope,
                    metrics=[*scope_metrics.metrics, *metrics],
                    schema_url=scope_metrics.schema_url,
                )
                break
        else:
            scopes.append(ScopeMetrics(scope=self._scope, metrics=metrics, schema_url=""))
        resources[0] = ResourceMetrics(
            resource=first.resource, scope_metrics=scopes, schema_url=first.schema_url
        )
        return MetricsData(resource_metrics=resources)


# The loggers through which the SDK reports each failed attempt of an export
# (a retry log per attempt); muted on the threads running this module's
# exports, which report a failure once themselves.
_EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk.metrics._internal.export",
)
_exporting = threading.local()


class _Progress:
    """What a handler recorded and what its exports carried, so that close()
    and flush() do not wait a second time for data an export already
    waited for (a silent collector costs export_timeout per export):

    - ``recorded``: Stat events recorded so far;
    - ``settled``: the ``recorded`` of the latest finished export (success
      or failure): its data, or later data, were offered to the collector;
    - ``closing``: the handler is closing, its last export comes next.
    """

    __slots__ = ("closing", "recorded", "settled")

    def __init__(self) -> None:
        self.recorded = 0
        self.settled = 0
        self.closing = False

    def nothing_new(self) -> bool:
        return self.recorded == self.settled


class _MuteOwnExports(logging.Filter):
    """Drops the SDK's records on a thread inside one of our exports,
    keeping the last one's text as the failure's reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(_exporting, "active", False):
            return True
        try:
            _exporting.reason = record.getMessage()
        except Exception:
            pass
        return False


_mute_installed = False


def _install_mute() -> None:
    global _mute_installed
    if not _mute_installed:
        mute = _MuteOwnExports()
        for name in _EXPORT_LOGGERS:
            logging.getLogger(name).addFilter(mute)
        _mute_installed = True


_exporter_class_made: Any = None


def _exporter_class() -> Any:
    """The exporter wrapper's class, made once, on first use (it subclasses
    the SDK's, imported only when a handler is made)."""
    global _exporter_class_made
    if _exporter_class_made is None:
        _exporter_class_made = _make_exporter_class()
    return _exporter_class_made


def _make_exporter_class() -> Any:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class _ReportingExporter(MetricExporter):
        """Wraps the user's exporter: each export's outcome goes to the
        handler's ``_outcome`` (one stderr line per outage)."""

        def __init__(
            self,
            inner: MetricExporter,
            outcome: Callable[[bool, str], None],
            progress: _Progress,
        ) -> None:
            super().__init__(
                preferred_temporality=getattr(inner, "_preferred_temporality", None),
                preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
            )
            self.inner = inner
            self._outcome = outcome
            self._progress = progress

        def export(
            self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
        ) -> Any:
            progress = self._progress
            # What the collection held (set by the reader when it started).
            carried = getattr(_exporting, "collected", progress.recorded)
            on_demand = progress.closing or getattr(_exporting, "on_demand", False)
            if on_demand and carried == progress.settled:
                # flush() or the last export at close, with nothing recorded
                # since the previous export finished, which already waited
                # for (or delivered) this very data. (A periodic export still
                # goes: it keeps the gauges' series alive.)
                return MetricExportResult.SUCCESS
            _exporting.active, _exporting.reason = True, ""
            try:
                result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception as exc:
                result, _exporting.reason = MetricExportResult.FAILURE, repr(exc)
            finally:
                _exporting.active = False
                progress.settled = max(progress.settled, carried)
            self._outcome(result == MetricExportResult.SUCCESS, _exporting.reason)
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(self.inner.force_flush(timeout_millis=timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    return _ReportingExporter


_reader_class: Any = None


def _periodic_reader(
    exporter: MetricExporter,
    histograms: _Histograms,
    progress: _Progress,
    interval_ms: float | None,
    timeout_ms: float | None,
) -> Any:
    """The SDK's PeriodicExportingMetricReader, adding the histograms to each
    collection: the SDK's instruments take one measurement at a time, and
    nothing in its API takes an aggregated histogram, so they join the
    collection on its way to the exporter (``_receive_metrics``, the method
    the SDK documents for reader subclasses to override)."""
    global _reader_class
    if _reader_class is None:
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        class _Reader(PeriodicExportingMetricReader):
            def __init__(
                self,
                exporter: MetricExporter,
                histograms: _Histograms,
                progress: _Progress,
                interval_ms: float | None,
                timeout_ms: float | None,
            ) -> None:
                # Set before the base class starts the exporting thread.
                self._torchmon_histograms = histograms
                self._torchmon_progress = progress
                super().__init__(
                    exporter, export_interval_millis=interval_ms, export_timeout_millis=timeout_ms
                )

            # The SDK marks collect() final (typing only) to keep its
            # signature; this one keeps it and calls it. Read before
            # collecting: an event recorded during the collection may be
            # missing from it, so it must count as new (_ReportingExporter).
            def collect(self, timeout_millis: float = 10_000) -> None:  # type: ignore[misc]
                _exporting.collected = self._torchmon_progress.recorded
                try:
                    super().collect(timeout_millis)
                finally:
                    del _exporting.collected

            def _receive_metrics(
                self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
            ) -> None:
                metrics_data = self._torchmon_histograms.attach(metrics_data)
                super()._receive_metrics(metrics_data, timeout_millis, **kwargs)

        _reader_class = _Reader
    return _reader_class(exporter, histograms, progress, interval_ms, timeout_ms)


def _seconds_to_ms(value: object, argument: str, call: str = _OWNER) -> float | None:
    seconds = check_optional_seconds(call, argument, value)
    return None if seconds is None else seconds * 1000.0


def _check_scale(scale: object) -> int | None:
    # OpenTelemetry's smallest scale to the scale torchmon's buckets are kept at.
    if scale is None:
        return None
    return check_int(
        _OWNER, "scale", scale, low=MIN_SCALE, high=MAX_SCALE, expected="an int or None"
    )


def _check_max_buckets(max_buckets: object) -> int:
    # At OpenTelemetry's smallest scale every double falls into 3 buckets.
    return check_int(_OWNER, "max_buckets", max_buckets, low=3)


class OpenTelemetryEventHandler(ClosesAtExit):
    """An event handler recording every Stat window with OpenTelemetry gauges,
    and the distributions of Stats with P aggregations as exponential
    histograms when it owns its exporter.

    For each ``torch.monitor.Stat`` event, each data item ``"<stat>.<agg>"``
    (``"train.loss.mean": 0.25``) is recorded (``Gauge.set``) on the
    synchronous gauge named after the key (``train.loss.mean``, see
    :func:`otel_instrument_name`), with ``attributes``. A gauge is created
    the first time its name is seen. Other events are ignored, and so are
    non-numeric (``str``, ``bool``) values and NaN and the infinities, which
    OpenTelemetry gauges do not take (the gauge keeps its previous value).

    Where the metrics go, one of:

    - ``meter_provider``: an ``opentelemetry.metrics.MeterProvider`` (such as
      ``opentelemetry.sdk.metrics.MeterProvider``); ``None`` (and no
      ``exporter``) means the global one
      (``opentelemetry.metrics.get_meter_provider()``: set it with
      ``set_meter_provider``, before or after creating the handler). Gauges
      only: the SDK's instruments take single measurements, not a window's
      histogram (docs/sinks.md).
    - ``exporter``: an ``opentelemetry.sdk.metrics.export.MetricExporter``
      (an OTLP exporter, see :meth:`otlp`). The handler makes its own meter
      provider with ``resource``, exporting every ``export_interval``
      seconds (``None``: the SDK's default, ``OTEL_METRIC_EXPORT_INTERVAL`` or
      60 s; ``math.inf``: only at :meth:`flush` and :meth:`close`), and adds
      each Stat's merged distribution as an ExponentialHistogram point named
      after the Stat (``train.step_time``), with at most ``max_buckets``
      buckets per sign (OpenTelemetry's ``max_size``; fewer by lowering the
      scale). The histograms follow the exporter's preferred temporality for
      histograms: cumulative (all windows since the handler was created), or
      delta (the windows since the previous export). ``scale`` (an int in
      [-10, 6]; an extension) fixes the scale of every histogram point
      instead: each point has every bucket its range needs at that scale
      (``max_buckets`` does not apply), so a series' bucket bounds never
      change from one export to the next, which backends that store each
      bucket as a series of its own need (VictoriaMetrics; docs/sinks.md).

    - ``export_timeout``: with an exporter, how long :meth:`flush` and
      :meth:`close` (so the process exit) wait for an export, retries
      included, in seconds (default 5); neither exports (nor waits) when
      nothing was recorded since the previous export finished. An export that failed or did not
      finish in time is reported as one line on stderr, naming the
      destination and the metrics not sent; the next one only after an
      export succeeded again (docs/sinks.md, "Unreachable collector").
    - ``meter_name``: the instrumentation scope of the meter (default
      ``"torchmon"``).
    - ``attributes``: constant attributes put on every measurement and
      histogram point, e.g. ``{"rank": 0, "job": "pretrain"}`` (values
      ``str``, ``bool``, ``int`` or ``float``).

    The measurement's time is when the reader collects it, not the event's
    timestamp (OpenTelemetry gauges take no time). Instrument names are
    case-insensitive (the Python SDK exports them lower-cased): two keys that
    map to the same name raise ``ValueError``.
    Synchronous gauges need opentelemetry-api 1.23 or later.
    """

    # torchmon.flush() flushes it after the sinks that write locally.
    _flushes_remotely = True

    __slots__ = (
        "__weakref__",  # torchmon.flush() and the exit hook hold it weakly
        "_attributes",
        "_destination",
        "_export_timeout",
        "_failing",
        "_gauges",
        "_histograms",
        "_last_export",
        "_lock",
        "_meter",
        "_owner_pid",
        "_progress",
        "_provider",
        "_reader",
        "_sources",
    )

    def __init__(
        self,
        *,
        meter_provider: MeterProvider | None = None,
        meter_name: str = "torchmon",
        attributes: Mapping[str, _AttributeValue] | None = None,
        exporter: MetricExporter | None = None,
        export_interval: float | None = None,
        resource: Resource | None = None,
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        export_timeout: float | None = None,
        scale: int | None = None,
    ) -> None:
        require(
            "OpenTelemetryEventHandler",
            "opentelemetry.metrics",
            library="opentelemetry",
            pip_name="opentelemetry-sdk",
            extra="otel",
        )
        from opentelemetry import metrics

        from .. import __version__

        if not isinstance(meter_name, str):
            raise arg_type_error(_OWNER, "meter_name", "a str", meter_name)
        if not meter_name:
            raise arg_value_error(_OWNER, "meter_name", "must not be empty")
        self._attributes = _check_attributes(attributes)
        self._histograms: _Histograms | None = None
        self._provider: SdkMeterProvider | None = None
        self._failing = False
        self._last_export = time.time()
        self._destination = ""
        self._progress = _Progress()
        self._reader: Any = None
        if exporter is not None:
            timeout_ms = _seconds_to_ms(export_timeout, "export_timeout")
            self._export_timeout = (
                DEFAULT_EXPORT_TIMEOUT if timeout_ms is None else timeout_ms / 1000.0
            )
            if meter_provider is not None:
                raise arg_value_error(
                    _OWNER, "exporter", "cannot be given with a meter_provider: give one of them"
                )
            meter_provider = self._own_provider(
                exporter, meter_name, export_interval, resource, max_buckets, scale
            )
        else:
            self._export_timeout = DEFAULT_EXPORT_TIMEOUT
            for name, value in (
                ("export_interval", export_interval),
                ("resource", resource),
                ("export_timeout", export_timeout),
                ("scale", scale),
            ):
                if value is not None:
                    raise arg_value_error(_OWNER, name, "applies only with an exporter")
            if meter_provider is None:
                meter_provider = metrics.get_meter_provider()
            elif not isinstance(meter_provider, metrics.MeterProvider):
                raise arg_type_error(
                    _OWNER,
                    "meter_provider",
                    "an opentelemetry.metrics.MeterProvider or None",
                    meter_provider,
                )
        meter: Meter = meter_provider.get_meter(meter_name, __version__)
        if not callable(getattr(meter, "create_gauge", None)):
            raise ImportError(
                "OpenTelemetryEventHandler needs synchronous gauges (Meter.create_gauge), "
                "new in opentelemetry-api 1.23: pip install -U 'opentelemetry-sdk>=1.23'"
            )
        self._meter = meter
        self._gauges: dict[str, Gauge] = {}  # lower-cased instrument name -> gauge
        # Lower-cased instrument name -> the data key of its gauge, or the
        # Stat name of its histogram (kept apart by the second item).
        self._sources: dict[str, tuple[str, bool]] = {}
        self._lock = new_lock()
        self._closed = False
        # A forked child inherits the provider with the parent's gauges and
        # histograms, but not its exporting thread: exporting them from the
        # child would send the parent's data twice (docs/sinks.md).
        self._owner_pid = os.getpid()
        self._at_exit = None
        if self._provider is not None:
            _register_flushable(self)
            self._close_at_exit()

    def _own_provider(
        self,
        exporter: object,
        meter_name: str,
        export_interval: object,
        resource: object,
        max_buckets: object,
        scale: object,
    ) -> SdkMeterProvider:
        require(
            "OpenTelemetryEventHandler(exporter)",
            "opentelemetry.sdk.metrics",
            library="the opentelemetry SDK",
            pip_name="opentelemetry-sdk",
            extra="otel",
        )
        from opentelemetry.sdk.metrics import Histogram, MeterProvider
        from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        from .. import __version__

        if not isinstance(exporter, MetricExporter):
            raise arg_type_error(
                _OWNER,
                "exporter",
                "an opentelemetry.sdk.metrics.export.MetricExporter or None",
                exporter,
            )
        interval_ms = _seconds_to_ms(export_interval, "export_interval")
        if resource is None:
            resource = Resource.create()
        elif not isinstance(resource, Resource):
            raise arg_type_error(
                _OWNER, "resource", "an opentelemetry.sdk.resources.Resource or None", resource
            )
        # The exporter's wish, as the SDK's own reader reads it (an OTLP
        # exporter: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE).
        preferred = getattr(exporter, "_preferred_temporality", None) or {}
        delta = preferred.get(Histogram) == AggregationTemporality.DELTA
        self._histograms = _Histograms(
            scope=InstrumentationScope(meter_name, __version__, None, None),
            resource=resource,
            attributes=self._attributes,
            max_buckets=_check_max_buckets(max_buckets),
            scale=_check_scale(scale),
            delta=delta,
        )
        endpoint = getattr(exporter, "_endpoint", None)
        self._destination = endpoint if isinstance(endpoint, str) else type(exporter).__name__
        _install_mute()
        reporting = _exporter_class()(exporter, self._export_outcome, self._progress)
        if interval_ms is not None and interval_ms == math.inf:
            interval_ms = _NEVER_MS
        reader = _periodic_reader(
            reporting, self._histograms, self._progress, interval_ms, self._export_timeout * 1000.0
        )
        self._reader = reader
        # Not the provider's own exit hook: close() bounds the last export.
        self._provider = MeterProvider(
            metric_readers=[reader], resource=resource, shutdown_on_exit=False
        )
        return self._provider

    @classmethod
    def otlp(
        cls,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        export_interval: float | None = None,
        timeout: float | None = None,
        attributes: Mapping[str, _AttributeValue] | None = None,
        resource_attributes: Mapping[str, _AttributeValue] | None = None,
        meter_name: str = "torchmon",
        max_buckets: int = DEFAULT_MAX_BUCKETS,
        export_timeout: float | None = None,
        scale: int | None = None,
    ) -> OpenTelemetryEventHandler:
        """A handler pushing this rank's metrics over OTLP/HTTP (needs
        ``pip install opentelemetry-exporter-otlp-proto-http``).

        ``endpoint`` is the metrics URL (``http://collector:4318/v1/metrics``);
        ``None`` leaves it and ``headers`` to the exporter's
        ``OTEL_EXPORTER_OTLP_*`` environment variables. ``timeout`` (seconds)
        bounds each export's requests and retries; ``None`` takes
        ``OTEL_EXPORTER_OTLP_METRICS_TIMEOUT`` or ``OTEL_EXPORTER_OTLP_TIMEOUT``
        if set, else ``export_timeout`` (5 s by default), which also bounds
        :meth:`flush` and the exit. The points
        carry this rank's ``rank``, ``local_rank``, ``node`` and ``job``
        (torchrun's ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK`` and
        ``TORCHELASTIC_RUN_ID``; the Prometheus sink's labels) and then
        ``attributes``; the resource has ``service.name`` ``"torchmon"``
        (unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` name
        one), a ``service.instance.id`` distinct per process
        (``<host>/rank<rank>/pid<pid>``), ``host.name``, then
        ``OTEL_RESOURCE_ATTRIBUTES`` and ``resource_attributes``.
        The other arguments are the constructor's (docs/sinks.md).
        """
        require(
            "OpenTelemetryEventHandler.otlp",
            "opentelemetry.exporter.otlp.proto.http.metric_exporter",
            library="the OTLP/HTTP exporter",
            pip_name="opentelemetry-exporter-otlp-proto-http",
            extra="otlp",
        )
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource

        if endpoint is not None and not isinstance(endpoint, str):
            raise arg_type_error(_OTLP, "endpoint", "a str or None", endpoint)
        if headers is not None and (
            not isinstance(headers, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise TypeError(arg_message(_OTLP, "headers", "must map str to str"))
        timeout_ms = _seconds_to_ms(timeout, "timeout", _OTLP)
        export_timeout_ms = _seconds_to_ms(export_timeout, "export_timeout", _OTLP)
        if timeout_ms is None and not any(
            os.environ.get(name)
            for name in ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
        ):
            # The exporter's own default is 10 s per export, retries included.
            timeout_ms = (
                DEFAULT_EXPORT_TIMEOUT * 1000.0 if export_timeout_ms is None else export_timeout_ms
            )
        labels, identity = _rank_identity()
        extra = _check_attributes(resource_attributes)
        # Ours are defaults: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
        # override them (Resource.create alone would let ours win), and
        # resource_attributes override everything.
        resource = (
            Resource.create({SERVICE_NAME: "torchmon", **identity})
            .merge(OTELResourceDetector().detect())
            .merge(Resource(extra))
        )
        exporter = OTLPMetricExporter(
            endpoint=endpoint,
            headers=dict(headers) if headers is not None else None,
            timeout=timeout_ms / 1000.0 if timeout_ms is not None else None,
        )
        return cls(
            exporter=exporter,
            export_interval=export_interval,
            resource=resource,
            attributes={**labels, **_check_attributes(attributes)},
            meter_name=meter_name,
            max_buckets=max_buckets,
            export_timeout=export_timeout,
            scale=scale,
        )

    def _claim(self, name: str, source: str, histogram: bool) -> bool:
        """Claims the instrument name for a gauge's data key or a histogram's
        Stat name; False if it is new. Raises ValueError if another source
        holds it (names are case-insensitive)."""
        folded = name.lower()
        held = self._sources.get(folded)
        if held is None:
            self._sources[folded] = (source, histogram)
            return False
        if held != (source, histogram):

            def named(source: str, histogram: bool) -> str:
                return f"the histogram of Stat {source!r}" if histogram else repr(source)

            both = (
                f"Stat keys {held[0]!r} and {source!r}"
                if not (held[1] or histogram)
                else f"{named(*held)} and {named(source, histogram)}"
            )
            raise ValueError(
                f"OpenTelemetryEventHandler: {both} both map to the instrument name "
                f"{name!r} (names are case-insensitive)"
            )
        return True

    def _gauge(self, key: str) -> Gauge:
        """The gauge for a data key, created on first sight."""
        name = otel_instrument_name(key)
        with self._lock:
            if not self._claim(name, key, False):
                gauge = self._meter.create_gauge(name, description=stat_description(key))
                self._gauges[name.lower()] = gauge
                return gauge
            return self._gauges[name.lower()]

    def __call__(self, event: Event) -> None:
        if event.name != STAT_EVENT or self._closed or self._inherited():
            return
        self._progress.recorded += 1
        # finite_only: the SDK would drop NaN and the infinities, logging a warning each time.
        set_numeric_values(event.data, self._gauge, self._set, finite_only=True)
        histograms = self._histograms
        distribution = event.distribution
        if histograms is None or distribution is None:
            return
        stat = _stat_name(event.data)
        if stat is None:
            return
        name = otel_instrument_name(stat)
        with self._lock:
            self._claim(name, stat, True)
        histograms.add(name, f"torchmon Stat {stat!r}, distribution of its samples", distribution)

    def _inherited(self) -> bool:
        """Whether this is a forked child's copy of a handler with its own
        exporter: it neither records nor exports (the parent does both)."""
        return self._provider is not None and os.getpid() != self._owner_pid

    def _set(self, gauge: Gauge, value: float) -> None:
        gauge.set(value, attributes=self._attributes)

    def flush(self, timeout: float | None = None) -> bool:
        """Exports now (with an exporter; otherwise nothing to do): what the
        gauges hold and the histograms. Waits at most ``timeout`` seconds
        (``None``: ``export_timeout``); returns whether the export finished
        in time and succeeded. ``torchmon.flush()`` calls it after the
        Stats' open windows reached this handler and the local sinks were
        flushed."""
        provider = self._provider
        if provider is None or self._closed or self._inherited():
            return True
        if self._progress.nothing_new():
            # The last export (periodic or flush) carried everything
            # recorded: another would send nothing new, and, with a silent
            # collector, wait export_timeout again.
            return not self._failing
        seconds = self._export_timeout if timeout is None else timeout

        def export_now() -> None:
            _exporting.on_demand = True
            try:
                provider.force_flush(timeout_millis=seconds * 1000.0)
            finally:
                _exporting.on_demand = False

        ok = self._bounded(export_now, seconds)
        return ok and not self._failing

    def close(self) -> None:
        """Exports a last time and shuts down the handler's own meter
        provider and exporter (with an exporter; otherwise nothing to do),
        waiting at most ``export_timeout`` seconds for the export. Later
        events are ignored. Idempotent."""
        self._close(at_exit=False)

    def _close(self, *, at_exit: bool) -> None:
        if not self._begin_close():
            return
        provider = self._provider
        if provider is None or self._inherited():
            # A forked child's copy: the parent's exporter and data are the
            # parent's to send.
            return
        if at_exit:
            # Sinks writing locally first: a dead collector must not keep
            # them waiting until the process is killed.
            _flush_local_sinks()
        reader_thread = self._reader_thread()
        self._progress.closing = True
        # The reader's thread makes the last export (none when nothing was
        # recorded since the previous one finished: _ReportingExporter); the shutdown waits for
        # it at most export_timeout, then shuts the exporter down (which
        # stops its retries).
        provider.shutdown(timeout_millis=self._export_timeout * 1000.0)
        if reader_thread is not None and reader_thread.is_alive():
            self._report(f"did not finish within export_timeout={self._export_timeout:g} s")

    def _reader_thread(self) -> threading.Thread | None:
        # Kept from _own_provider: the SDK's MeterProvider no longer lists
        # its readers in _sdk_config (opentelemetry-sdk 1.45).
        thread = getattr(self._reader, "_daemon_thread", None)
        return thread if isinstance(thread, threading.Thread) else None

    def _bounded(self, work: Callable[[], object], seconds: float) -> bool:
        """Runs ``work`` on a helper thread, waiting ``seconds`` at most; it
        runs here when no thread can be started (interpreter shutdown)."""
        done = threading.Event()

        def run() -> None:
            try:
                work()
            except Exception as exc:
                self._export_outcome(False, repr(exc))
            finally:
                done.set()

        try:
            threading.Thread(target=run, name="torchmon-otel-flush", daemon=True).start()
        except RuntimeError:
            run()
        if done.wait(seconds):
            return True
        self._report(f"did not finish within {seconds:g} s")
        return False

    def _export_outcome(self, success: bool, reason: str) -> None:
        if success:
            self._failing = False
            self._last_export = time.time()
        else:
            self._report(reason.splitlines()[0] if reason else "the export failed")

    def _report(self, why: str) -> None:
        """One stderr line per outage: until an export succeeds again,
        later failures are silent."""
        if self._failing:
            return
        self._failing = True
        since = time.strftime("%H:%M:%S", time.localtime(self._last_export))
        try:
            sys.stderr.write(
                f"torchmon: OpenTelemetryEventHandler: the metrics since {since} were not "
                f"sent to {self._destination}: {why}\n"
            )
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass  # no stderr (closed, or None under pythonw)

    def __repr__(self) -> str:
        return (
            f"OpenTelemetryEventHandler(meter={self._meter.name!r}, "
            f"attributes={self._attributes!r}, {len(self._gauges)} gauges)"
        )
