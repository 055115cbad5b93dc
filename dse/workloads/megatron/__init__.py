"""The built-in Megatron-Core trial process (``python -m dse.workloads.megatron.trainer``).

Importing this package does not import torch or megatron: the trainer imports them when a
trial runs, and :func:`detect_features` only when called.
"""

from __future__ import annotations

from dse.workloads.megatron._plan import EXIT_FAILURE, EXIT_OK
from dse.workloads.megatron.features import detect_features

__all__ = ["TRAINER_MODULE", "EXIT_OK", "EXIT_FAILURE", "detect_features"]

#: The module torchrun runs: ``torchrun ... -m TRAINER_MODULE --spec trial.json``.
TRAINER_MODULE = "dse.workloads.megatron.trainer"
