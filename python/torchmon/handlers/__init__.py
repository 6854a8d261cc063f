"""Event handlers (sinks) for torchmon.

``PrometheusEventHandler`` and ``OpenTelemetryEventHandler`` import their
libraries (the ``prometheus`` and ``otel`` extras) only when created.
"""

from .jsonl import JsonlEventHandler, read_jsonl
from .otel import OpenTelemetryEventHandler
from .prometheus import PrometheusEventHandler
from .tensorboard import TensorboardEventHandler

__all__ = [
    "JsonlEventHandler",
    "OpenTelemetryEventHandler",
    "PrometheusEventHandler",
    "TensorboardEventHandler",
    "read_jsonl",
]
