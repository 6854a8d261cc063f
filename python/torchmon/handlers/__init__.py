"""Event handlers (sinks) for torchmon.

``PrometheusEventHandler``, ``OpenTelemetryEventHandler`` and
``MLflowEventHandler`` import their libraries (the ``prometheus``, ``otel``
and ``mlflow`` extras) only when created.
"""

from .._core import AsyncEventHandler
from .jsonl import JsonlEventHandler, read_jsonl
from .mlflow import MLflowEventHandler
from .otel import OpenTelemetryEventHandler
from .prometheus import PrometheusEventHandler
from .tensorboard import TensorboardEventHandler

__all__ = [
    "AsyncEventHandler",
    "JsonlEventHandler",
    "MLflowEventHandler",
    "OpenTelemetryEventHandler",
    "PrometheusEventHandler",
    "TensorboardEventHandler",
    "read_jsonl",
]
