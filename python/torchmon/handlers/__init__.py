"""Event handlers (sinks) for torchmon.

``PrometheusEventHandler``, ``OpenTelemetryEventHandler``,
``MLflowEventHandler`` and ``WandbEventHandler`` import their libraries (the
``prometheus``, ``otel``, ``mlflow`` and ``wandb`` extras) only when created.
"""

from .._core import AsyncEventHandler
from .jsonl import JsonlEventHandler, read_jsonl
from .mlflow import MLflowEventHandler
from .otel import OpenTelemetryEventHandler
from .prometheus import PrometheusEventHandler
from .tensorboard import TensorboardEventHandler
from .wandb import WandbEventHandler

__all__ = [
    "AsyncEventHandler",
    "JsonlEventHandler",
    "MLflowEventHandler",
    "OpenTelemetryEventHandler",
    "PrometheusEventHandler",
    "TensorboardEventHandler",
    "WandbEventHandler",
    "read_jsonl",
]
