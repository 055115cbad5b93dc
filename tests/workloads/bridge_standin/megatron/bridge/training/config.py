"""ConfigContainer sections and runtime_config_update in Bridge 0.6's order (checked against
Bridge's source at the pinned commit by tests/workloads/test_bridge_standin_order.py): the
recipe's environment defaults are applied, a preset string is resolved and the
mixed-precision config set up onto model, optimizer and DDP, the data-parallel size is
computed, the communication-overlap config is set up (it overwrites the DDP overlap fields),
then the whole configuration is validated."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from megatron.bridge.training.mixed_precision import (
    MixedPrecisionConfig,
    get_mixed_precision_config,
)


@dataclass
class ModelConfig:
    bf16: bool = False
    tensor_model_parallel_size: int = 1
    seq_length: int = 64


@dataclass
class DistributedDataParallelConfig:
    grad_reduce_in_fp32: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    use_distributed_optimizer: bool = False


@dataclass
class CommOverlapConfig:
    """Bridge's CommOverlapConfig, its optimizer part: with the distributed optimizer, the
    DDP overlap of the gradient reduction and the parameter gather is on exactly when the
    data-parallel size is above 1 (``_get_optimizer_overlap_cfgs``); a value given here
    (not None) wins."""

    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    data_parallel_size: int | None = None

    def finalize(self) -> None:
        pass

    def setup(self, model: ModelConfig, optimizer: OptimizerConfig,
              ddp: DistributedDataParallelConfig) -> None:  # fmt: skip
        if not ddp.use_distributed_optimizer:
            return
        on = (self.data_parallel_size or 1) > 1
        for name in ("overlap_grad_reduce", "overlap_param_gather"):
            given = getattr(self, name)
            setattr(ddp, name, on if given is None else given)


@dataclass
class OptimizerConfig:
    bf16: bool = False
    lr: float = 1e-4


@dataclass
class TrainingConfig:
    train_iters: int = 4
    global_batch_size: int = 8
    micro_batch_size: int = 1


@dataclass
class DatasetConfig:
    seq_length: int = 64


@dataclass
class LoggerConfig:
    log_interval: int = 10


@dataclass
class ConfigContainer:
    model: ModelConfig = field(default_factory=ModelConfig)
    ddp: DistributedDataParallelConfig = field(default_factory=DistributedDataParallelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainingConfig = field(default_factory=TrainingConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    mixed_precision: MixedPrecisionConfig | str | None = None
    comm_overlap: CommOverlapConfig | None = None
    env_vars: dict[str, str | int | float | bool] = field(default_factory=dict)
    data_parallel_size: int = 1

    def set_data_parallel_size(self) -> None:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.data_parallel_size = max(1, world // self.model.tensor_model_parallel_size)
        if self.comm_overlap is not None:
            self.comm_overlap.data_parallel_size = self.data_parallel_size

    def validate(self) -> None:
        """The batch check Bridge's validate makes (the rest it validates is not here)."""
        per_step = self.train.micro_batch_size * self.data_parallel_size
        if self.train.global_batch_size % per_step:
            raise AssertionError(
                f"global_batch_size {self.train.global_batch_size} is not divisible by "
                f"micro_batch_size x data_parallel_size = {per_step}"
            )


def apply_environment_variables(cfg: ConfigContainer) -> None:
    """The recipe's environment defaults; what the process has already set wins."""
    for name, value in cfg.env_vars.items():
        os.environ.setdefault(name, str(value))


def runtime_config_update(cfg: ConfigContainer) -> None:
    apply_environment_variables(cfg)
    if cfg.mixed_precision is not None:
        if isinstance(cfg.mixed_precision, str):
            cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision)
        cfg.mixed_precision.finalize()
        cfg.mixed_precision.setup(cfg.model, cfg.optimizer, cfg.ddp)
    cfg.set_data_parallel_size()
    if cfg.comm_overlap is not None:
        cfg.comm_overlap.finalize()
        cfg.comm_overlap.setup(cfg.model, cfg.optimizer, cfg.ddp)
    cfg.validate()
