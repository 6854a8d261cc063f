"""torchmon in the training frameworks users already run (docs/integrations.md).

- ``torchmon.integrations.transformers.TorchmonCallback``: a Hugging Face
  ``Trainer`` callback (extra ``transformers``).
- ``torchmon.integrations.lightning.TorchmonLogger`` and
  ``torchmon.integrations.lightning.TorchmonCallback``: a Lightning logger and
  callback (extra ``lightning``).

Neither framework is a dependency of torchmon, and ``import torchmon`` loads
none of this package: each module imports its framework when it is imported,
and raises an ``ImportError`` naming what to install when it is missing.
"""
