"""Event handlers (sinks) for torchmon.

``PrometheusEventHandler`` and ``OpenTelemetryEventHandler`` import their
libraries (the ``prometheus`` and ``otel`` extras) only when created.
"""

from .._core import AsyncEventHandler
from .jsonl import JsonlEventHandler, read_jsonl
from .otel import OpenTelemetryEventHandler
from .prometheus import PrometheusEventHandler
from .tensorboard import TensorboardEventHandler

__all__ = [
    "AsyncEventHandler",
    "JsonlEventHandler",
    "OpenTelemetryEventHandler",
    "PrometheusEventHandler",
    "TensorboardEventHandler",
    "read_jsonl",
]
