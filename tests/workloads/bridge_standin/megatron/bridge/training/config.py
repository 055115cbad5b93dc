"""ConfigContainer sections and runtime_config_update in Bridge 0.6's order: a preset string
is resolved, then the mixed-precision config is set up onto model, optimizer and DDP."""

from __future__ import annotations

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


def runtime_config_update(cfg: ConfigContainer) -> None:
    if cfg.mixed_precision is not None:
        if isinstance(cfg.mixed_precision, str):
            cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision)
        cfg.mixed_precision.finalize()
        cfg.mixed_precision.setup(cfg.model, cfg.optimizer, cfg.ddp)
