"""Prometheus sink: Stat windows become gauges (needs ``pip install prometheus-client``).

``prometheus_client`` is imported when a handler is created, never by
``import torchmon``.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._core import STAT_EVENT, Event
from .._forksafe import new_lock
from ._common import ClosesOnExit, check_mapping, require, set_numeric_values, stat_description

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry, Gauge

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
        "_labels",
        "_lock",
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
            set_numeric_values(event.data, self._gauge, _set_gauge)

    def close(self) -> None:
        """Unregisters this handler's gauges from the registry (a second call does nothing)."""
        with self._lock:
            self._closed = True
            gauges = list(self._gauges.values())
            self._gauges.clear()
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
            f"{len(self._gauges)} gauges{state})"
        )


def _set_gauge(gauge: Gauge, value: float) -> None:
    gauge.set(value)
