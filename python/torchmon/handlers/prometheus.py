"""Prometheus sink: Stat windows become gauges (needs ``pip install prometheus-client``).

``prometheus_client`` is imported when a handler is created, never by
``import torchmon``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from .._core import STAT_EVENT, Event
from .._forksafe import new_lock

if TYPE_CHECKING:
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


def _import_prometheus_client() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "PrometheusEventHandler needs prometheus_client, which cannot be imported "
            f"({exc}): pip install prometheus-client (in a torchmon checkout: "
            "pip install '.[prometheus]')"
        ) from exc


def _check_labels(labels: object) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(
            "PrometheusEventHandler(labels): must be a mapping of label names to str "
            f"values, not {type(labels).__name__}"
        )
    checked: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(name, str):
            raise TypeError(
                f"PrometheusEventHandler(labels): label names must be str, not {name!r}"
            )
        if not _LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(
                f"PrometheusEventHandler(labels): invalid label name {name!r} (must match "
                "[a-zA-Z_][a-zA-Z0-9_]* and not start with '__')"
            )
        if not isinstance(value, str):
            raise TypeError(
                f"PrometheusEventHandler(labels): the value of {name!r} must be a str, "
                f"not {type(value).__name__}"
            )
        checked[name] = value
    return checked


class PrometheusEventHandler:
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
        "_sources",
    )

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        prefix: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        _import_prometheus_client()
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

    @property
    def registry(self) -> CollectorRegistry:
        """The registry the gauges are in."""
        return self._registry

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
        stat, _, aggregation = key.rpartition(".")
        documentation = (
            f"torchmon Stat {stat!r}, {aggregation} over the last closed window"
            if stat
            else f"torchmon Stat value {key!r}"
        )
        try:
            gauge = prometheus_client.Gauge(
                name,
                documentation,
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
        first_error: ValueError | None = None
        with self._lock:
            if self._closed:
                raise ValueError("PrometheusEventHandler is closed")
            for key, value in event.data.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                try:
                    gauge = self._gauge(key)
                except ValueError as exc:
                    first_error = first_error or exc
                    continue
                gauge.set(value)
        if first_error is not None:
            raise first_error

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

    def __enter__(self) -> PrometheusEventHandler:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return (
            f"PrometheusEventHandler(prefix={self._prefix!r}, labels={self._labels!r}, "
            f"{len(self._gauges)} gauges{state})"
        )
