"""Prometheus sink: Stat windows become gauges (needs ``pip install prometheus-client``).

``prometheus_client`` is imported when a handler is created, never by
``import torchmon``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._core import STAT_EVENT, Event
from .._forksafe import new_lock
from ._common import ClosesOnExit, check_mapping, require, set_numeric_values, stat_description

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

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return (
            f"PrometheusEventHandler(prefix={self._prefix!r}, labels={self._labels!r}, "
            f"{len(self._gauges)} gauges{state})"
        )


def _set_gauge(gauge: Gauge, value: float) -> None:
    gauge.set(value)
