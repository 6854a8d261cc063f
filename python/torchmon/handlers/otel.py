"""OpenTelemetry sink: Stat windows become synchronous gauges
(needs ``pip install opentelemetry-sdk``).

``opentelemetry`` is imported when a handler is created, never by
``import torchmon``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Union

from .._core import STAT_EVENT, Event
from .._forksafe import new_lock
from ._common import check_mapping, require, set_numeric_values, stat_description

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter, MeterProvider
    from opentelemetry.metrics import _Gauge as Gauge  # public only under this name

__all__ = ["OpenTelemetryEventHandler", "otel_instrument_name"]

_AttributeValue = Union[str, bool, int, float]

_INVALID_INSTRUMENT_CHAR = re.compile(r"[^-_./a-zA-Z0-9]")
_MAX_INSTRUMENT_NAME = 255


def otel_instrument_name(key: str) -> str:
    """The instrument name for a Stat event key: ``"train.loss.mean"`` stays as is.

    OpenTelemetry instrument names are ``[a-zA-Z][-_./a-zA-Z0-9]{0,254}``:
    any other character (a space, a ``:``, any non-ASCII character) becomes
    ``_``; a name that does not start with an ASCII letter is prefixed with
    ``torchmon.``; names longer than 255 characters are cut there.
    """
    name = _INVALID_INSTRUMENT_CHAR.sub("_", key)
    if not name or not ("a" <= name[0] <= "z" or "A" <= name[0] <= "Z"):
        name = "torchmon." + name
    return name[:_MAX_INSTRUMENT_NAME]


def _check_attribute_key(key: str) -> None:
    if not key:
        raise ValueError("OpenTelemetryEventHandler(attributes): keys must not be empty")


def _check_attributes(attributes: object) -> dict[str, _AttributeValue]:
    return check_mapping(
        attributes,
        "OpenTelemetryEventHandler(attributes)",
        expected="str keys to str/bool/int/float values",
        key_noun="keys",
        check_key=_check_attribute_key,
        value_types=(str, bool, int, float),
        value_text="a str, bool, int or float",
    )


class OpenTelemetryEventHandler:
    """An event handler recording every Stat window with OpenTelemetry gauges.

    For each ``torch.monitor.Stat`` event, each data item ``"<stat>.<agg>"``
    (``"train.loss.mean": 0.25``) is recorded (``Gauge.set``) on the
    synchronous gauge named after the key (``train.loss.mean``, see
    :func:`otel_instrument_name`), with ``attributes``. A gauge is created
    the first time its name is seen. Other events are ignored, and so are
    non-numeric (``str``, ``bool``) values and NaN and the infinities, which
    OpenTelemetry gauges do not take (the gauge keeps its previous value).

    - ``meter_provider``: an ``opentelemetry.metrics.MeterProvider`` (such as
      ``opentelemetry.sdk.metrics.MeterProvider``); ``None`` means the global
      one (``opentelemetry.metrics.get_meter_provider()``: set it with
      ``set_meter_provider``, before or after creating the handler).
    - ``meter_name``: the instrumentation scope of the meter (default
      ``"torchmon"``).
    - ``attributes``: constant attributes put on every measurement, e.g.
      ``{"rank": 0, "job": "pretrain"}`` (values ``str``, ``bool``, ``int`` or
      ``float``).

    The measurement's time is when the reader collects it, not the event's
    timestamp (OpenTelemetry gauges take no time). Instrument names are
    case-insensitive (the Python SDK exports them lower-cased): two keys that
    map to the same name raise ``ValueError``.
    Synchronous gauges need opentelemetry-api 1.23 or later.
    """

    __slots__ = ("_attributes", "_gauges", "_lock", "_meter", "_sources")

    def __init__(
        self,
        *,
        meter_provider: MeterProvider | None = None,
        meter_name: str = "torchmon",
        attributes: Mapping[str, _AttributeValue] | None = None,
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

        if meter_provider is None:
            meter_provider = metrics.get_meter_provider()
        elif not isinstance(meter_provider, metrics.MeterProvider):
            raise TypeError(
                "OpenTelemetryEventHandler(meter_provider): must be an "
                "opentelemetry.metrics.MeterProvider or None, "
                f"not {type(meter_provider).__name__}"
            )
        if not isinstance(meter_name, str):
            raise TypeError(
                "OpenTelemetryEventHandler(meter_name): must be a str, "
                f"not {type(meter_name).__name__}"
            )
        if not meter_name:
            raise ValueError("OpenTelemetryEventHandler(meter_name): must not be empty")
        self._attributes = _check_attributes(attributes)
        meter: Meter = meter_provider.get_meter(meter_name, __version__)
        if not callable(getattr(meter, "create_gauge", None)):
            raise ImportError(
                "OpenTelemetryEventHandler needs synchronous gauges (Meter.create_gauge), "
                "new in opentelemetry-api 1.23: pip install -U 'opentelemetry-sdk>=1.23'"
            )
        self._meter = meter
        self._gauges: dict[str, Gauge] = {}  # lower-cased instrument name -> gauge
        self._sources: dict[str, str] = {}  # lower-cased instrument name -> data key
        self._lock = new_lock()

    def _gauge(self, key: str) -> Gauge:
        """The gauge for a data key, created on first sight."""
        name = otel_instrument_name(key)
        folded = name.lower()
        with self._lock:
            source = self._sources.get(folded)
            if source is None:
                gauge = self._meter.create_gauge(name, description=stat_description(key))
                self._gauges[folded] = gauge
                self._sources[folded] = key
                return gauge
        if source != key:
            raise ValueError(
                f"OpenTelemetryEventHandler: Stat keys {source!r} and {key!r} both map to "
                f"the instrument name {name!r} (names are case-insensitive)"
            )
        return self._gauges[folded]

    def __call__(self, event: Event) -> None:
        if event.name != STAT_EVENT:
            return
        # finite_only: the SDK would drop NaN and the infinities, logging a warning each time.
        set_numeric_values(event.data, self._gauge, self._set, finite_only=True)

    def _set(self, gauge: Gauge, value: float) -> None:
        gauge.set(value, attributes=self._attributes)

    def __repr__(self) -> str:
        return (
            f"OpenTelemetryEventHandler(meter={self._meter.name!r}, "
            f"attributes={self._attributes!r}, {len(self._gauges)} gauges)"
        )
