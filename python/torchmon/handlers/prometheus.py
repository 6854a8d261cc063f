"""Prometheus sink: Stat windows become gauges (needs ``pip install prometheus-client``),
and the windows' distributions cumulative histograms.

``prometheus_client`` is imported when a handler is created, never by
``import torchmon``.
"""

from __future__ import annotations

import errno
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

from .._core import STAT_EVENT, Event
from .._forksafe import new_lock
from ._common import ClosesOnExit, check_mapping, require, set_numeric_values, stat_description

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry, Gauge

    from .._distribution import Distribution

__all__ = ["PrometheusEventHandler", "prometheus_metric_name"]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_INVALID_METRIC_CHAR = re.compile(r"[^a-zA-Z0-9_:]")


def prometheus_metric_name(key: str, prefix: str = "") -> str:
    """The gauge name for a Stat event key: ``"train.loss.mean"`` -> ``"train_loss_mean"``.

    ``prefix`` is prepended as is. Every character outside ``[a-zA-Z0-9_:]``
    (a dot, a dash, a space, any non-ASCII character) becomes ``_``, and a
    name that would start with a digit (or be empty) gets a leading ``_``.
    """
    name = prefix + _INVALID_METRIC_CHAR.sub("_", key)
    if not name or name[0].isdigit():
        name = "_" + name
    return name


def _check_label_name(name: str) -> None:
    if not _LABEL_NAME.match(name) or name.startswith("__"):
        raise ValueError(
            f"PrometheusEventHandler(labels): invalid label name {name!r} (must match "
            "[a-zA-Z_][a-zA-Z0-9_]* and not start with '__')"
        )


def _check_labels(labels: object) -> dict[str, str]:
    return check_mapping(
        labels,
        "PrometheusEventHandler(labels)",
        expected="label names to str values",
        key_noun="label names",
        check_key=_check_label_name,
        value_types=(str,),
        value_text="a str",
    )


class PrometheusEventHandler(ClosesOnExit):
    """An event handler exposing every Stat window as Prometheus gauges.

    For each ``torch.monitor.Stat`` event, each data item ``"<stat>.<agg>"``
    (``"train.loss.mean": 0.25``) sets the gauge
    ``prefix + prometheus_metric_name(key)`` (``train_loss_mean``) to the value:
    the gauge shows the last closed window. A gauge is created in ``registry``
    the first time its name is seen. Other events are ignored, and so are
    non-numeric (``str``, ``bool``) values.

    - ``registry``: a ``prometheus_client.CollectorRegistry``; ``None`` means
      ``prometheus_client.REGISTRY``, the default registry that
      ``prometheus_client.start_http_server(port)`` serves.
    - ``prefix``: prepended to every name (``"myjob_"``); it must itself be a
      valid metric name start (``[a-zA-Z_:][a-zA-Z0-9_:]*``) or empty.
    - ``labels``: constant labels put on every gauge, e.g.
      ``{"rank": "0", "job": "pretrain"}``; names must be valid Prometheus
      label names, values ``str``.
    - ``histogram_buckets_per_octave``: a Stat event that carries a
      distribution (``event.distribution``: a Stat with a P aggregation) is
      also exported as the cumulative histogram
      ``prefix + prometheus_metric_name(<stat>) + "_histogram"``, summed
      over every window, with this many ``le`` bounds per power of two (1,
      2, 4, 8, 16, 32 or 64); ``None`` exports no histogram. See
      :class:`_DistributionHistogram` and docs/sinks.md ("Prometheus").

    A metric name belongs to one handler per registry: a name that is already
    registered there (by another handler or collector) raises ``ValueError``
    when it is first seen, as do two keys that sanitise to the same name.
    ``close()`` (or leaving a ``with`` block) unregisters this handler's
    gauges, so that a new handler may create them again; an event handed to a
    closed handler raises ``ValueError``.
    """

    __slots__ = (
        "_children",
        "_closed",
        "_gauges",
        "_histograms",
        "_labels",
        "_lock",
        "_per_octave",
        "_prefix",
        "_registry",
        "_server",
        "_sources",
    )

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        prefix: str = "",
        labels: Mapping[str, str] | None = None,
        histogram_buckets_per_octave: int | None = 4,
    ) -> None:
        require(
            "PrometheusEventHandler",
            "prometheus_client",
            library="prometheus_client",
            pip_name="prometheus-client",
            extra="prometheus",
        )
        import prometheus_client

        if registry is None:
            registry = prometheus_client.REGISTRY
        elif not isinstance(registry, prometheus_client.CollectorRegistry):
            raise TypeError(
                "PrometheusEventHandler(registry): must be a prometheus_client.CollectorRegistry "
                f"or None, not {type(registry).__name__}"
            )
        if not isinstance(prefix, str):
            raise TypeError(
                f"PrometheusEventHandler(prefix): must be a str, not {type(prefix).__name__}"
            )
        if prefix and not _METRIC_NAME.match(prefix):
            raise ValueError(
                f"PrometheusEventHandler(prefix): {prefix!r} is not a valid metric name "
                "prefix (must match [a-zA-Z_:][a-zA-Z0-9_:]*)"
            )
        self._labels = _check_labels(labels)
        self._per_octave = _check_per_octave(histogram_buckets_per_octave)
        # metric name -> its histogram, created at the first window that has one.
        self._histograms: dict[str, _DistributionHistogram] = {}
        self._registry = registry
        self._prefix = prefix
        self._gauges: dict[str, Gauge] = {}  # metric name -> the gauge
        self._children: dict[str, Gauge] = {}  # metric name -> what to set (labelled)
        self._sources: dict[str, str] = {}  # metric name -> the data key it was made for
        self._lock = new_lock()
        self._closed = False
        self._server: tuple[WSGIServer, threading.Thread] | None = None  # set by serve()

    @property
    def registry(self) -> CollectorRegistry:
        """The registry the gauges are in."""
        return self._registry

    @classmethod
    def serve(
        cls, port_base: int = 9400, host: str = "127.0.0.1", **handler_options: Any
    ) -> PrometheusEventHandler:
        """A handler that already serves its registry over HTTP (``/metrics``)
        on ``host``, port ``port_base + LOCAL_RANK``: one call per rank of a
        torchrun job (docs/guide.md, "Multi-node setups").

        ``handler_options`` are the constructor's: ``registry`` defaults to a
        new ``CollectorRegistry`` of this handler's own (not the global
        one), ``labels`` to ``torchmon.rank_info().labels()`` (``rank``,
        ``local_rank``, ``node``, ``job``); labels given replace those.
        ``port_base=0`` serves on a free port. ``.port`` is the port served;
        ``close()`` also stops the server and frees the port. A port that is
        taken raises ``OSError`` (``errno.EADDRINUSE``) naming it.
        """
        import prometheus_client

        from .._rank import rank_info

        if isinstance(port_base, bool) or not isinstance(port_base, int):
            raise TypeError(
                "PrometheusEventHandler.serve(port_base): must be an int, "
                f"not {type(port_base).__name__}"
            )
        if not isinstance(host, str):
            raise TypeError(
                f"PrometheusEventHandler.serve(host): must be a str, not {type(host).__name__}"
            )
        info = rank_info()
        port = port_base + info.local_rank if port_base else 0
        if not 0 <= port_base <= port <= 65535:
            raise ValueError(
                f"PrometheusEventHandler.serve(port_base): {port_base} + LOCAL_RANK "
                f"{info.local_rank} = {port} is not a port in [0, 65535]"
            )
        options = dict(handler_options)
        if options.get("registry") is None:
            options["registry"] = prometheus_client.CollectorRegistry()
        if "labels" not in options:
            options["labels"] = info.labels()
        handler = cls(**options)
        try:
            # A (server, thread) pair since prometheus_client 0.17, the
            # version pyproject.toml requires.
            server = prometheus_client.start_http_server(port, addr=host, registry=handler.registry)
        except OSError as exc:
            handler.close()
            if exc.errno == errno.EADDRINUSE:
                raise OSError(
                    errno.EADDRINUSE,
                    f"PrometheusEventHandler.serve: port {port} on {host} is already in use "
                    f"(port_base {port_base} + LOCAL_RANK {info.local_rank})",
                ) from None
            raise OSError(
                exc.errno,
                f"PrometheusEventHandler.serve: cannot serve on {host} port {port}: "
                f"{exc.strerror or exc}",
            ) from None
        handler._server = server
        return handler

    @property
    def port(self) -> int | None:
        """The port ``serve()`` serves on (``None`` for a handler made by the
        constructor, or once closed)."""
        server = self._server
        return None if server is None else int(server[0].server_port)

    def _stop_server(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            httpd, thread = server
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=10)

    def _gauge(self, key: str) -> Gauge:
        """The (labelled) gauge for a data key, created on first sight; called with
        the lock held."""
        import prometheus_client

        name = prometheus_metric_name(key, self._prefix)
        source = self._sources.get(name)
        if source is not None:
            if source != key:
                raise ValueError(
                    f"PrometheusEventHandler: Stat keys {source!r} and {key!r} both map to "
                    f"the metric name {name!r}"
                )
            return self._children[name]
        try:
            gauge = prometheus_client.Gauge(
                name,
                stat_description(key),
                labelnames=tuple(self._labels),
                registry=self._registry,
            )
        except ValueError as exc:
            raise ValueError(
                f"PrometheusEventHandler: cannot create the gauge {name!r} for {key!r}: {exc} "
                "(another handler or collector registered that name; give this handler "
                "its own prefix or registry, or close() the other handler)"
            ) from None
        self._gauges[name] = gauge
        self._sources[name] = key
        # The labelled child; positional values, so that a label may be named "self".
        child = gauge.labels(*self._labels.values()) if self._labels else gauge
        self._children[name] = child
        return child

    def __call__(self, event: Event) -> None:
        if event.name != STAT_EVENT:
            return
        with self._lock:
            if self._closed:
                raise ValueError("PrometheusEventHandler is closed")
            data = event.data
            distribution = getattr(event, "distribution", None)
            if distribution is None or self._per_octave is None:
                set_numeric_values(data, self._gauge, _set_gauge)
                return
            try:
                set_numeric_values(data, self._gauge, _set_gauge)
            finally:
                # A gauge name clash must not lose the window's histogram.
                self._observe(data, distribution)

    def _observe(self, data: Mapping[str, object], distribution: Distribution) -> None:
        """Adds a window's distribution to its Stat's histogram, created on first
        sight (like a gauge); called with the lock held."""
        key = next(iter(data), None)
        if key is None:  # no key to name the Stat by
            return
        stat = key.rpartition(".")[0] or key
        name = prometheus_metric_name(stat, self._prefix) + "_histogram"
        histogram = self._histograms.get(name)
        if histogram is None:
            source = self._sources.get(name)
            if source is not None:
                raise ValueError(
                    f"PrometheusEventHandler: the histogram of Stat {stat!r} and the gauge "
                    f"of {source!r} both map to the metric name {name!r}"
                )
            assert self._per_octave is not None
            histogram = _DistributionHistogram(
                name, stat, self._labels, self._per_octave, self._lock
            )
            try:
                self._registry.register(histogram)
            except ValueError as exc:
                raise ValueError(
                    f"PrometheusEventHandler: cannot create the histogram {name!r} for Stat "
                    f"{stat!r}: {exc} (another handler or collector registered that name; "
                    "give this handler its own prefix or registry, or close() the other handler)"
                ) from None
            self._histograms[name] = histogram
            self._sources[name] = f"{stat} (histogram)"
        histogram.add(distribution)

    def close(self) -> None:
        """Unregisters this handler's gauges from the registry (a second call does nothing)."""
        with self._lock:
            self._closed = True
            gauges: list[Any] = list(self._gauges.values())
            gauges += self._histograms.values()
            self._gauges.clear()
            self._histograms.clear()
            self._children.clear()
            self._sources.clear()
        for gauge in gauges:
            self._registry.unregister(gauge)
        self._stop_server()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        if self._server is not None:
            state += f", serving on port {self.port}"
        return (
            f"PrometheusEventHandler(prefix={self._prefix!r}, labels={self._labels!r}, "
            f"{len(self._gauges)} gauges, {len(self._histograms)} histograms{state})"
        )


def _set_gauge(gauge: Gauge, value: float) -> None:
    gauge.set(value)


# --- histograms of distributions -----------------------------------------------

_PER_OCTAVE_CHOICES = (1, 2, 4, 8, 16, 32, 64)


def _check_per_octave(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            "PrometheusEventHandler(histogram_buckets_per_octave): must be an int or None, "
            f"not {type(value).__name__}"
        )
    if value not in _PER_OCTAVE_CHOICES:
        raise ValueError(
            "PrometheusEventHandler(histogram_buckets_per_octave): must divide 64 "
            f"(1, 2, 4, 8, 16, 32 or 64), got {value}"
        )
    return value


class _DistributionHistogram:
    """The cumulative classic histogram of one Stat's distributions, summed
    over windows: a collector in the handler's registry.

    The ``le`` bounds are scale-6 bucket boundaries, one every
    ``64 // per_octave`` buckets: for positive values the largest double of a
    group of buckets (``2**(g/per_octave)`` rounded down), so that
    ``x <= le`` holds exactly for the samples of that group and below, and
    the counts are exact. Only the groups from just below the smallest to
    the largest value seen are exposed, each side of zero, so the set of
    ``le`` grows as the data reaches new octaves and never shrinks.
    Negative groups (by ``|x|``) have the bound just below ``-2**(g/b)``, as
    their upper bound is the inclusive one; ``-5e-324`` separates the
    negative samples from the zeros (``le="0.0"``), so that a quantile that
    falls on the zeros is 0, not a point between the largest negative bound
    and 0. NaN samples are in no bucket and not in ``_count``; ``+inf`` ones
    only in ``+Inf``. ``_sum`` adds the windows' SUM when it is finite (a
    window with a NaN or infinite sample adds nothing to it).
    """

    __slots__ = (
        "_labels",
        "_lock",
        "_negative",
        "_negative_inf",
        "_positive",
        "_positive_inf",
        "_shift",
        "_stat",
        "_sum",
        "_zero",
        "name",
    )

    def __init__(
        self, name: str, stat: str, labels: dict[str, str], per_octave: int, lock: Any
    ) -> None:
        self.name = name
        self._stat = stat
        self._labels = labels
        # A group of buckets is the bucket index >> shift (64 // per_octave buckets).
        self._shift = (64 // per_octave).bit_length() - 1
        self._lock = lock
        self._positive: dict[int, int] = {}
        self._negative: dict[int, int] = {}
        self._zero = 0
        self._positive_inf = 0
        self._negative_inf = 0
        self._sum = 0.0

    def add(self, distribution: Distribution) -> None:
        """Called with the lock held."""
        shift = self._shift
        for side, buckets in (
            (self._positive, distribution.positive),
            (self._negative, distribution.negative),
        ):
            for index, count in buckets:
                group = index >> shift
                side[group] = side.get(group, 0) + count
        self._zero += distribution.zero_count
        self._positive_inf += distribution.positive_inf_count
        self._negative_inf += distribution.negative_inf_count
        if math.isfinite(distribution.sum):
            self._sum += distribution.sum

    def _group_upper(self, group: int) -> float:
        """The largest double whose bucket is in ``group`` or below."""
        from .._distribution import MAX_INDEX, MIN_INDEX, _upper

        last = ((group + 1) << self._shift) - 1
        return _upper(min(max(last, MIN_INDEX - 1), MAX_INDEX))

    def buckets(self) -> tuple[list[tuple[float, int]], float]:
        """``[(le, cumulative count)]`` in ascending ``le`` ending with ``+inf``,
        and the sum; taken under the lock."""
        with self._lock:
            positive = dict(self._positive)
            negative = dict(self._negative)
            zero, total_sum = self._zero, self._sum
            negative_inf, positive_inf = self._negative_inf, self._positive_inf
        bounds: list[tuple[float, int]] = []

        def bound(le: float, count: int) -> None:
            if bounds and bounds[-1][0] == le:  # groups below the subnormals
                bounds[-1] = (le, count)
            else:
                bounds.append((le, count))

        below = negative_inf
        if negative or negative_inf:
            if negative:
                high, low = max(negative), min(negative)
                # x <= -nextup(upper(g)) is x < -upper(g): the groups above g.
                for group in range(high, low - 2, -1):
                    bound(-math.nextafter(self._group_upper(group), math.inf), below)
                    below += negative.get(group, 0)
            bound(-5e-324, below)
        below += zero
        bound(0.0, below)
        if positive:
            high, low = max(positive), min(positive)
            for group in range(low - 1, high + 1):
                below += positive.get(group, 0)
                bound(self._group_upper(group), below)
        bound(math.inf, below + positive_inf)
        return bounds, total_sum

    def describe(self) -> list[Any]:
        from prometheus_client.core import HistogramMetricFamily

        return [HistogramMetricFamily(self.name, self._help(), labels=list(self._labels))]

    def _help(self) -> str:
        return f"torchmon Stat {self._stat!r}, every sample of every closed window"

    def collect(self) -> list[Any]:
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.samples import Sample
        from prometheus_client.utils import floatToGoString

        bounds, total_sum = self.buckets()
        family = HistogramMetricFamily(self.name, self._help(), labels=list(self._labels))
        values = list(self._labels.values())
        # The le text of prometheus_client's own histograms.
        to_text: Callable[[float], str] = floatToGoString
        family.add_metric(values, [(to_text(le), count) for le, count in bounds], None)
        # HistogramMetricFamily leaves out _count and _sum once a bound is
        # negative (a sum that may go down is no counter); _count still is one.
        labels = dict(self._labels)
        family.samples.append(Sample(self.name + "_count", labels, bounds[-1][1], None, None))
        family.samples.append(Sample(self.name + "_sum", labels, total_sum, None, None))
        return [family]
