"""Prometheus sink: Stat windows become gauges (needs ``pip install prometheus-client``),
and the windows' distributions cumulative histograms.

``prometheus_client`` is imported when a handler is created, never by
``import torchmon``.
"""

from __future__ import annotations

import errno
import io
import math
import os
import re
import socket
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Callable

from .._core import STAT_EVENT, Event, _PrometheusExposition
from .._errors import arg_message, arg_type_error, arg_value_error, check_int
from .._forksafe import new_lock
from ._common import ClosesOnExit, check_mapping, require, set_numeric_values, stat_description

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from .._distribution import Distribution

__all__ = [
    "DEFAULT_HISTOGRAM_RANGE",
    "PROTOBUF_CONTENT_TYPE",
    "PrometheusEventHandler",
    "prometheus_metric_name",
]

# What a scraper that asks for the Prometheus protobuf format gets
# (docs/sinks.md, "Native histograms").
PROTOBUF_CONTENT_TYPE = (
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
)
# OpenTelemetry's default max_size for an exponential histogram.
DEFAULT_NATIVE_HISTOGRAM_MAX_BUCKETS = 160

# What the argument errors name (the one format: python/torchmon/_errors.py).
_OWNER = "PrometheusEventHandler"
_SERVE = "PrometheusEventHandler.serve"
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_INVALID_METRIC_CHAR = re.compile(r"[^a-zA-Z0-9_:]")
_TAKEN = (
    "(another handler or collector registered that name; give this handler its own prefix "
    "or registry, or close() the other handler)"
)

# 1 µs to 12 days in seconds (1 ns to 17 min in milliseconds): any duration a
# training job times, at 4 bounds per octave 161 bounds (docs/sinks.md).
DEFAULT_HISTOGRAM_RANGE = (2.0**-20, 2.0**20)


#: The gauge of seconds since a running torchmon.Watchdog last saw a step
#: (0 while paused), after the handler's prefix; read at each scrape by the
#: native exposition, so it grows while the process is wedged (docs/watchdog.md).
WATCHDOG_GAUGE = "torchmon_watchdog_seconds_since_beat"


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
        raise arg_value_error(
            _OWNER,
            "labels",
            f"has an invalid label name {name!r} (must match [a-zA-Z_][a-zA-Z0-9_]* and "
            "not start with '__')",
        )
    if name == "le":
        # Every series of a classic histogram has its own `le`; a constant one
        # would be a second `le` label on each (prometheus_client's Histogram
        # refuses it too). `quantile` belongs to summaries, which this
        # handler does not export, so it stays allowed.
        raise arg_value_error(
            _OWNER,
            "labels",
            "has an invalid label name 'le' (Prometheus reserves it for the upper bounds "
            "of histogram buckets)",
        )


def _check_labels(labels: object) -> dict[str, str]:
    return check_mapping(
        labels,
        "PrometheusEventHandler",
        "labels",
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
      2, 4, 8, 16, 32 or 64); ``None`` exports no histogram.
    - ``histogram_range``: ``(lo, hi)``, ``0 < lo < hi``, both finite
      (default ``(2**-20, 2**20)``): the histogram's ``le`` bounds are
      ``0.0``, then every bound from the largest one at or below ``lo`` to
      the smallest one at or above ``hi``, then ``+Inf``: the same set on
      every rank from the first scrape, whatever the data, so that
      ``sum by (le)`` across ranks adds like with like (docs/sinks.md,
      "Histograms of the P aggregations").
    - ``native_histogram_max_buckets``: the bucket limit of each native
      histogram in a protobuf scrape (default 160); above it the resolution
      is halved until the buckets fit (docs/sinks.md, "Native histograms").
    - ``protobuf_classic_buckets``: also put the classic ``le`` buckets into
      the protobuf body (for a migration: Prometheus then keeps both
      series; default ``False``).

    A scraper that asks for ``application/vnd.google.protobuf`` (Prometheus
    with native histograms enabled) gets every distribution as one native
    histogram of the same name, rendered in Rust without the GIL; any other
    gets the classic text exposition. :meth:`serve` negotiates this, and
    :meth:`wsgi_app` serves it from a user's own server.

    The handler's state is the native exposition only: ``registry`` holds
    one collector of this handler's, which reads that state when the
    registry is collected. A metric name belongs to one handler per
    registry: a name that is already registered there (by another handler
    or collector) raises ``ValueError`` when it is first seen, as do two
    keys that sanitise to the same name. ``close()`` (or leaving a ``with``
    block) unregisters this handler's collector, so that a new handler may
    create its names again; an event handed to a closed handler raises
    ``ValueError``.
    """

    __slots__ = (
        "__weakref__",
        "_closed",
        "_collector",
        "_histograms",
        "_labels",
        "_lock",
        "_native",
        "_new_names",
        "_prefix",
        "_registry",
        "_server",
        "_sources",
        "_text_from_core",
    )

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        prefix: str = "",
        labels: Mapping[str, str] | None = None,
        histogram_buckets_per_octave: int | None = 4,
        histogram_range: tuple[float, float] = DEFAULT_HISTOGRAM_RANGE,
        native_histogram_max_buckets: int = DEFAULT_NATIVE_HISTOGRAM_MAX_BUCKETS,
        protobuf_classic_buckets: bool = False,
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
            raise arg_type_error(
                _OWNER, "registry", "a prometheus_client.CollectorRegistry or None", registry
            )
        if not isinstance(prefix, str):
            raise arg_type_error(_OWNER, "prefix", "a str", prefix)
        if prefix and not _METRIC_NAME.match(prefix):
            raise arg_value_error(
                _OWNER,
                "prefix",
                f"must be a valid metric name prefix (matching [a-zA-Z_:][a-zA-Z0-9_:]*), "
                f"not {prefix!r}",
            )
        self._labels = _check_labels(labels)
        per_octave = _check_per_octave(histogram_buckets_per_octave)
        lo, hi = _check_range(histogram_range)
        max_buckets = _check_max_buckets(native_histogram_max_buckets)
        if not isinstance(protobuf_classic_buckets, bool):
            raise arg_type_error(
                _OWNER, "protobuf_classic_buckets", "a bool", protobuf_classic_buckets
            )
        self._histograms = per_octave is not None
        # The handler's one state, in Rust; the classic bounds are laid out there.
        self._native = _PrometheusExposition(
            list(self._labels.items()),
            max_buckets,
            None if per_octave is None else (per_octave, lo, hi),
            protobuf_classic_buckets,
            prefix + WATCHDOG_GAUGE,
        )
        _LIVE_HANDLERS.add(self)
        self._registry = registry
        self._prefix = prefix
        # metric name -> the data key it was made for, in the order declared.
        self._sources: dict[str, str] = {}
        # The names first seen by the event being handled, each held in the
        # registry by a stateless _Collector until the collector takes them over.
        self._new_names: list[_Collector] = []
        self._collector = _Collector(self._native, self._labels)
        registry.register(self._collector)
        self._lock = new_lock()
        self._closed = False
        # Set by serve(): the port of the core's server, or the Python one.
        self._server: int | tuple[WSGIServer, threading.Thread] | None = None
        # Whether the registry holds this handler's metrics only (serve()
        # made it), so that the core's text is the registry's text.
        self._text_from_core = False

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
        taken raises ``OSError`` (``errno.EADDRINUSE``) naming it. With its
        own registry the server is a Rust thread that never takes the GIL
        (``/metrics`` and ``/``, text format 0.0.4 or protobuf by the
        ``Accept`` header); with a ``registry`` given, :meth:`wsgi_app` on a
        Python thread per request, so that the registry's other collectors
        are served too (docs/sinks.md, "Native histograms"). Both bound
        slow clients: a request head has 5 s in all, and a newcomer finding
        the 64 connection threads taken shuts down the one that has waited
        longest for its head (docs/sinks.md, "Serving").
        """
        import prometheus_client

        from .._rank import rank_info

        if isinstance(port_base, bool) or not isinstance(port_base, int):
            raise arg_type_error(_SERVE, "port_base", "an int", port_base)
        if not isinstance(host, str):
            raise arg_type_error(_SERVE, "host", "a str", host)
        info = rank_info()
        port = port_base + info.local_rank if port_base else 0
        if not 0 <= port_base <= port <= 65535:
            raise arg_value_error(
                _SERVE,
                "port_base",
                f"{port_base} + LOCAL_RANK {info.local_rank} = {port} is not a port in [0, 65535]",
            )
        options = dict(handler_options)
        own_registry = options.get("registry") is None
        if own_registry:
            options["registry"] = prometheus_client.CollectorRegistry()
        if "labels" not in options:
            options["labels"] = info.labels()
        handler = cls(**options)
        handler._text_from_core = own_registry
        server: int | tuple[WSGIServer, threading.Thread]
        try:
            if own_registry:
                # The registry holds only the core's metrics: a Rust thread
                # serves them, never taking the GIL (docs/sinks.md).
                server = handler._native.serve(host, port)
            else:  # it may hold other collectors: prometheus_client renders it
                server = _start_server(host, port, handler.wsgi_app())
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

    def render(self, accept: str | None = None) -> tuple[str, bytes] | None:
        """The body of a scrape whose ``Accept`` header is ``accept``, with its
        content type: protobuf when ``accept`` asks for
        :data:`PROTOBUF_CONTENT_TYPE` at least as much as for any text
        format (the Rust server's negotiation), otherwise prometheus_client's
        text (OpenMetrics when asked for). The text format 0.0.4 of a
        :meth:`serve` handler's own registry is rendered in Rust without the
        GIL too (the same bytes). ``None`` once closed."""
        protobuf, escaping, native_type = _PrometheusExposition.negotiate(accept or "")
        if protobuf:
            body = self._native.render(protobuf=True, escaping=escaping)
            return None if body is None else (native_type, body)
        if self._closed:
            return None
        # The one place prometheus_client renders: OpenMetrics, and a
        # registry that may hold other collectors (docs/sinks.md, "Serving").
        from prometheus_client.exposition import choose_encoder, generate_latest

        encoder, content_type = choose_encoder(accept or "")
        if self._text_from_core and encoder is generate_latest:
            # The Rust server's body, names and Content-Type.
            body = self._native.render(protobuf=False, escaping=escaping)
            return None if body is None else (native_type, body)
        return content_type, encoder(self._registry)

    def wsgi_app(self) -> Callable[[dict[str, Any], Any], Iterable[bytes]]:
        """A WSGI application serving :meth:`render`'s body for the request's
        ``Accept`` header on any path (as prometheus_client's), ``503`` once
        the handler is closed: mount it in a user's own server
        (docs/sinks.md, "Native histograms")."""
        return _ScrapeApp(self)

    @property
    def port(self) -> int | None:
        """The port ``serve()`` serves on (``None`` for a handler made by the
        constructor, once closed, or in a forked child, where the server's
        threads do not exist)."""
        server = self._server
        if server is None or isinstance(server, int):
            return server
        return int(server[0].server_port)

    def _stop_server(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if isinstance(server, int):
            self._native.stop_server()
        elif server is not None:
            httpd, thread = server
            httpd.shutdown()
            httpd.server_close()
            thread.join(timeout=10)

    def _gauge(self, key: str) -> str:
        """The gauge's name for a data key, declared on first sight; called
        with the lock held."""
        name = prometheus_metric_name(key, self._prefix)
        source = self._sources.get(name)
        if source is None:
            try:
                self._declare(
                    name, stat_description(key), key, histogram=False, utf8_name=self._prefix + key
                )
            except ValueError as exc:
                raise ValueError(
                    f"PrometheusEventHandler: cannot create the gauge {name!r} for {key!r}: "
                    f"{exc} {_TAKEN}"
                ) from None
        elif source != key:
            raise ValueError(
                f"PrometheusEventHandler: Stat keys {source!r} and {key!r} both map to "
                f"the metric name {name!r}"
            )
        return name

    def __call__(self, event: Event) -> None:
        if event.name != STAT_EVENT:
            return
        with self._lock:
            if self._closed:
                raise ValueError("PrometheusEventHandler is closed")
            data = event.data
            distribution = getattr(event, "distribution", None)
            try:
                set_numeric_values(data, self._gauge, self._native.set_gauge)
            finally:
                try:
                    # A gauge name clash must not lose the window's histogram.
                    if distribution is not None and self._histograms:
                        self._observe(data, distribution)
                finally:
                    if self._new_names:
                        self._take_over_new_names()

    def _observe(self, data: Mapping[str, object], distribution: Distribution) -> None:
        """Adds a window's distribution to its Stat's histogram, declared on
        first sight (like a gauge); called with the lock held."""
        key = next(iter(data), None)
        if key is None:  # no key to name the Stat by
            return
        stat = key.rpartition(".")[0] or key
        name = prometheus_metric_name(stat, self._prefix) + "_histogram"
        source = self._sources.get(name)
        if source is None:
            help_text = f"torchmon Stat {stat!r}, every sample of every closed window"
            try:
                self._declare(
                    name,
                    help_text,
                    f"{stat} (histogram)",
                    histogram=True,
                    utf8_name=f"{self._prefix}{stat}_histogram",
                )
            except ValueError as exc:
                raise ValueError(
                    f"PrometheusEventHandler: cannot create the histogram {name!r} for Stat "
                    f"{stat!r}: {exc} {_TAKEN}"
                ) from None
        elif not source.endswith(" (histogram)"):
            raise ValueError(
                f"PrometheusEventHandler: the histogram of Stat {stat!r} and the gauge "
                f"of {source!r} both map to the metric name {name!r}"
            )
        self._native.add_distribution(name, distribution)

    def _declare(
        self, name: str, help_text: str, source: str, *, histogram: bool, utf8_name: str
    ) -> None:
        """Declares a metric first seen once the registry accepts its name
        (and, for a histogram, its series' names), or raises the registry's
        ``ValueError``: the registry's own check, the name held there by a
        stateless _Collector until the event is handled."""
        family = _Collector.family(name, help_text, list(self._labels), histogram)
        names = _Collector(None, self._labels, family)
        self._registry.register(names)
        self._new_names.append(names)
        self._sources[name] = source
        # utf8_name: the name with the key's own characters, for a scraper
        # that asks for UTF-8 names (docs/sinks.md, "Prometheus 3").
        self._native.declare(name, help_text, histogram, utf8_name)

    def _take_over_new_names(self) -> None:
        """The collector, registered again, holds the names the event
        declared: one registration per event, not per name. Called with the
        lock held."""
        registry, collector = self._registry, self._collector
        for names in self._new_names:
            registry.unregister(names)
        collector.described += [names.described[0] for names in self._new_names]
        taken = len(self._new_names)
        self._new_names.clear()
        registry.unregister(collector)
        try:
            registry.register(collector)
        except ValueError:
            # Another thread registered one of the new names between the two
            # calls (prometheus_client has no atomic swap): the collector
            # keeps the names it held before, and the event's are first seen
            # again by the next event that has them.
            for family in collector.described[-taken:]:
                del self._sources[family.name]
            del collector.described[-taken:]
            registry.register(collector)
            raise

    def close(self) -> None:
        """Unregisters this handler's collector from the registry (a second
        call does nothing)."""
        # First: a scrape from now on is a 503, one in progress completes.
        self._native.close()
        with self._lock:
            closing, self._closed = not self._closed, True
        if closing:
            self._registry.unregister(self._collector)
        self._stop_server()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        if self._server is not None:
            state += f", serving on port {self.port}"
        histograms = sum(family.type == "histogram" for family in self._collector.described)
        return (
            f"PrometheusEventHandler(prefix={self._prefix!r}, labels={self._labels!r}, "
            f"{len(self._collector.described) - histograms} gauges, {histograms} histograms"
            f"{state})"
        )


class _Collector:
    """The one collector of a handler in its registry: the native state's
    families, read when the registry is collected (docs/sinks.md,
    "Prometheus"); ``described`` are the names it holds there, the only
    ones it collects. One without
    a state holds a metric's names from its first sight to the end of the
    event that declared it (``PrometheusEventHandler._declare``)."""

    __slots__ = ("_labels", "_native", "described")

    def __init__(
        self, native: _PrometheusExposition | None, labels: dict[str, str], *described: Metric
    ) -> None:
        self._native = native
        self._labels = labels
        self.described = list(described)

    @staticmethod
    def family(name: str, help_text: str, labels: list[str], histogram: bool) -> Metric:
        from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

        kind = HistogramMetricFamily if histogram else GaugeMetricFamily
        return kind(name, help_text, labels=labels)

    def describe(self) -> list[Metric]:
        return self.described

    def collect(self) -> Iterator[Metric]:
        """One family at a time, as the registry's renderers write them: a
        family already written can be freed, not all held at once."""
        if self._native is None:
            return
        names, values = list(self._labels), list(self._labels.values())
        le_texts = self._native.le_texts
        held = {family.name for family in self.described}
        for name, help_text, value, counts in self._native.families():
            if name not in held:  # not the registry's yet, or taken by another
                continue
            family: Any = self.family(name, help_text, names, counts is not None)
            if counts is None:
                family.add_metric(values, value)
            else:  # every bound is >= 0: _count (+Inf's count) and _sum are written too
                family.add_metric(values, list(zip(le_texts, counts)), value)
            yield family


# --- serving ----------------------------------------------------------------------

# Every live handler, whose native state a forked child resets.
_LIVE_HANDLERS: weakref.WeakSet[PrometheusEventHandler] = weakref.WeakSet()


def _reset_expositions_in_child() -> None:
    """A forked child's handlers get a new, empty native state with the
    metrics they had declared (the parent's may have been copied locked by
    a render on a server thread, which the child does not have), so that its
    own windows count from zero (docs/sinks.md, "Native histograms"), and no
    server: the child's copies of its sockets are closed and ``port`` is
    ``None``. Runs after _forksafe's hook has released the sinks' locks."""
    for sink in list(_LIVE_HANDLERS):
        sink._native._after_fork_in_child()  # closes the Rust server's sockets
        server, sink._server = sink._server, None
        if server is not None and not isinstance(server, int):
            server[0].forget_in_child()  # type: ignore[attr-defined]


def _stop_servers_at_exit() -> None:
    """The core's server threads stopped and joined (for up to 5 s each,
    detached from Python) before the interpreter finalizes. They never
    attach to Python, so the exit gate has nothing to hold back."""
    for sink in list(_LIVE_HANDLERS):
        sink._native.stop_server()


class _ScrapeApp:
    """The WSGI application of :meth:`PrometheusEventHandler.wsgi_app`. It
    holds the handler weakly: a server left running does not keep a
    dropped handler alive (it then answers 503)."""

    __slots__ = ("_handler",)

    def __init__(self, handler: PrometheusEventHandler) -> None:
        self._handler = weakref.ref(handler)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        handler = self._handler()
        rendered = None if handler is None else handler.render(environ.get("HTTP_ACCEPT"))
        if rendered is None:
            body = b"torchmon: this PrometheusEventHandler is closed\n"
            start_response(
                "503 Service Unavailable",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
            )
            return [body]
        content_type, body = rendered
        start_response(
            "200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        )
        return [b""] if method == "HEAD" else [body]


def _start_server(
    host: str, port: int, app: Callable[[dict[str, Any], Any], Iterable[bytes]]
) -> tuple[WSGIServer, threading.Thread]:
    """``app`` served on ``host:port`` by a daemon thread, a thread per
    connection, with the Rust server's bounds on slow clients
    (:class:`_ScrapeServer`)."""
    import threading
    from wsgiref.simple_server import make_server

    server_class = _scrape_server_class(
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    )
    httpd = make_server(host, port, app, server_class, handler_class=_scrape_handler_class())
    thread = threading.Thread(
        target=httpd.serve_forever, name=f"torchmon-prometheus-{port}", daemon=True
    )
    thread.start()
    return httpd, thread


# The Rust server's bounds on slow clients (docs/sinks.md, "Serving"):
# connection threads at once, the whole request head, the whole response,
# the threads that read a head only to answer 503 and their deadline, and
# the largest head.
(
    _MAX_CONNECTIONS,
    _HEAD_DEADLINE,
    _RESPONSE_DEADLINE,
    _MAX_REJECTING,
    _REJECT_DEADLINE,
    _MAX_HEAD,
) = _PrometheusExposition.limits()

# What a tracked connection's thread is doing (the Rust server's `Phase`).
_HEAD, _ANSWERING, _REJECTING, _EVICTED = "head", "answering", "rejecting", "evicted"


def _read_head(connection: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """The request head read until ``deadline`` (``time.monotonic()``), however
    the bytes trickle in, and whether it is complete."""
    import time

    head = b""
    while b"\r\n\r\n" not in head:
        left = deadline - time.monotonic()
        if left <= 0 or len(head) > _MAX_HEAD:
            return head, False
        try:
            connection.settimeout(left)
            chunk = connection.recv(4096)
        except OSError:  # timed out, reset, or shut down
            return head, False
        if not chunk:
            return head, False
        head += chunk
    return head, True


def _head_is_waiting(connection: socket.socket) -> bool:
    """Whether a whole request head has arrived on ``connection``, unread:
    peeked at without waiting (``recv`` on a socket with a timeout would
    first wait for it to be readable, hence the poll)."""
    import select

    poller = select.poll()
    poller.register(connection, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        peeked = connection.recv(4096, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False
    return b"\r\n\r\n" in peeked


def _shut_down(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by its client


def _scrape_server_class(family: int) -> type[WSGIServer]:
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIServer

    class _ScrapeServer(ThreadingMixIn, WSGIServer):
        """prometheus_client's WSGI server, as ``serve(registry=...)`` used it,
        with the Rust server's treatment of slow clients: a deadline for the
        whole head, at most ``_MAX_CONNECTIONS`` threads, the oldest
        connection still waiting for its head shut down for a newcomer,
        ``503`` after reading the head when every thread is answering, and
        ``server_close()`` ending the connection threads."""

        daemon_threads = True
        block_on_close = False
        address_family = family
        # socketserver's 5 made a burst of connections wait for the
        # kernel's SYN retries (seconds); 128 is the Rust server's (std's).
        request_queue_size = 128

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # connection -> [phase, accepted at, its thread]; the lock is
            # released in a forked child (_forksafe).
            self.connections: dict[socket.socket, list[Any]] = {}
            self.connections_lock = new_lock()
            self.closing = False
            super().__init__(*args, **kwargs)

        def process_request(self, request: Any, client_address: Any) -> None:
            import threading
            import time

            with self.connections_lock:
                phase = self._admit(request) if not self.closing else None
                if phase is None:
                    request.close()  # even the rejecting threads are busy
                    return
                thread = threading.Thread(
                    target=self.process_request_thread,
                    args=(request, client_address),
                    name="torchmon-prometheus-scrape",
                    daemon=True,
                )
                self.connections[request] = [phase, time.monotonic(), thread]
            thread.start()

        def _admit(self, request: socket.socket) -> str | None:
            """The phase of a new connection, or ``None`` to close it unread;
            called with the lock held."""
            entries = self.connections
            active = sum(1 for entry in entries.values() if entry[0] in (_HEAD, _ANSWERING))
            if active < _MAX_CONNECTIONS:
                return _HEAD
            waiting = sorted(
                (entry[1], id(connection), connection)
                for connection, entry in entries.items()
                if entry[0] == _HEAD
            )
            for _, _, connection in waiting:
                if not _head_is_waiting(connection):
                    _shut_down(connection)  # its thread sees the end and leaves
                    entries[connection][0] = _EVICTED
                    return _HEAD
            if sum(1 for entry in entries.values() if entry[0] == _REJECTING) < _MAX_REJECTING:
                return _REJECTING
            return None

        def phase_of(self, request: socket.socket) -> str:
            with self.connections_lock:
                entry = self.connections.get(request)
                return _EVICTED if entry is None else str(entry[0])

        def begin_answering(self, request: socket.socket) -> str:
            """The head of ``request`` is in: the phase it is answered in
            (``_ANSWERING``, ``_REJECTING``, or ``_EVICTED``: not at all)."""
            with self.connections_lock:
                entry = self.connections.get(request)
                if entry is None:
                    return _EVICTED
                if entry[0] == _HEAD:
                    entry[0] = _ANSWERING
                return str(entry[0])

        def shutdown_request(self, request: Any) -> None:
            with self.connections_lock:  # untracked before it is closed
                self.connections.pop(request, None)
            super().shutdown_request(request)

        def server_close(self) -> None:
            """Closes the listener and ends the connection threads: those
            still waiting for a head are shut down, those answering finish
            (a render after close() is a 503), each joined for up to 5 s in
            all."""
            import time

            super().server_close()
            with self.connections_lock:
                self.closing = True
                entries = list(self.connections.items())
                for connection, entry in entries:
                    if entry[0] in (_HEAD, _REJECTING):
                        _shut_down(connection)
                        entry[0] = _EVICTED
            deadline = time.monotonic() + 5.0
            for _, entry in entries:
                entry[2].join(max(0.0, deadline - time.monotonic()))

        def forget_in_child(self) -> None:
            """In a forked child, where the server's threads do not exist:
            closes the child's copies of the listener and of the connection
            sockets (never shuts them down, which would end the parent's
            connections too), so that the port is not held by the child and
            a connection the parent closes ends for its client."""
            # detach() and os.close(): close() leaves the descriptor open
            # while a makefile() of the parent's handler thread refers to it.
            for owned in [self.socket, *self.connections]:
                fd = owned.detach()
                if fd >= 0:
                    os.close(fd)
            self.connections.clear()

    return _ScrapeServer


def _scrape_handler_class() -> type[Any]:
    import time
    from wsgiref.simple_server import WSGIRequestHandler

    class _ScrapeHandler(WSGIRequestHandler):
        """Reads the head within the deadline before wsgiref parses it."""

        def setup(self) -> None:
            super().setup()
            server: Any = self.server
            rejecting = server.phase_of(self.request) == _REJECTING
            deadline = _REJECT_DEADLINE if rejecting else _HEAD_DEADLINE
            self.head, self.complete = _read_head(self.connection, time.monotonic() + deadline)
            self.phase = server.begin_answering(self.request)
            # wsgiref reads the request line and headers from rfile; a
            # scrape has no body.
            self.rfile.close()
            self.rfile = io.BytesIO(self.head)
            # A total for each sendall (Python >= 3.5), not per send.
            self.connection.settimeout(_REJECT_DEADLINE if rejecting else _RESPONSE_DEADLINE)

        def handle(self) -> None:
            if self.phase == _EVICTED or not self.head:
                return  # shut down for a newcomer or a close(), or silent
            if len(self.head) > _MAX_HEAD:
                self._plain("400 Bad Request", b"request head too large\n")
            elif not self.complete:
                self._plain("408 Request Timeout", b"request head too slow\n")
            elif self.phase == _REJECTING:
                self._plain("503 Service Unavailable", b"busy\n")
            else:
                super().handle()

        def _plain(self, status: str, body: bytes) -> None:
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            try:
                self.connection.sendall(head.encode() + body)
            except OSError:
                pass

        def log_message(self, format: str, *args: Any) -> None:
            """No line on stderr per scrape."""

    return _ScrapeHandler


# --- the histogram arguments ------------------------------------------------------

_PER_OCTAVE_CHOICES = (1, 2, 4, 8, 16, 32, 64)


def _check_per_octave(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise arg_type_error(_OWNER, "histogram_buckets_per_octave", "an int or None", value)
    if value not in _PER_OCTAVE_CHOICES:
        raise arg_value_error(
            _OWNER,
            "histogram_buckets_per_octave",
            f"must divide 64 (1, 2, 4, 8, 16, 32 or 64), got {value}",
        )
    return value


def _check_max_buckets(value: object) -> int:
    return check_int(_OWNER, "native_histogram_max_buckets", value, low=1)


def _check_range(value: object) -> tuple[float, float]:
    arg = "histogram_range"
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        got = type(value).__name__
        if isinstance(value, (tuple, list)):
            got += f" of length {len(value)}"
        raise TypeError(arg_message(_OWNER, arg, f"must be a (lo, hi) pair of numbers, not {got}"))
    for end in value:
        if isinstance(end, bool) or not isinstance(end, (int, float)):
            raise TypeError(
                arg_message(_OWNER, arg, f"must hold numbers, not {type(end).__name__}")
            )
    try:
        lo, hi = float(value[0]), float(value[1])
    except OverflowError:
        raise arg_value_error(_OWNER, arg, f"must be finite, got {tuple(value)!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise arg_value_error(_OWNER, arg, f"must be finite, got {(lo, hi)!r}")
    if not 0.0 < lo < hi:
        raise arg_value_error(_OWNER, arg, f"must have 0 < lo < hi, got {(lo, hi)!r}")
    return lo, hi
