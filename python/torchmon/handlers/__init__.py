"""Event handlers (sinks) for torchmon."""

from .tensorboard import TensorboardEventHandler

__all__ = ["TensorboardEventHandler"]
