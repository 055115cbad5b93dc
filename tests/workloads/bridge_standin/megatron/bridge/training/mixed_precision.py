"""MixedPrecisionConfig as Bridge 0.6 applies it: ``setup`` copies every field of the same
name onto the model, optimizer and DDP configs."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class MixedPrecisionConfig:
    bf16: bool = False
    fp16: bool = False
    grad_reduce_in_fp32: bool = True

    def finalize(self) -> None:
        pass

    def setup(self, model_config, optimizer_config=None, ddp_config=None) -> None:  # noqa: ANN001
        for config in (model_config, optimizer_config, ddp_config):
            if config is None:
                continue
            for f in fields(self):
                if hasattr(config, f.name):
                    setattr(config, f.name, getattr(self, f.name))


#: Presets by name (the values of Bridge's bf16_mixed preset that matter here).
PRESETS = {"bf16_mixed": {"bf16": True, "grad_reduce_in_fp32": True}}


def get_mixed_precision_config(name: str) -> MixedPrecisionConfig:
    return MixedPrecisionConfig(**PRESETS[name])
