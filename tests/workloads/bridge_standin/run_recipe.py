"""Stand-in for Bridge's scripts/training/run_recipe.py: ``--recipe NAME KEY=VALUE ...``
builds the recipe, applies the overrides with process_config_with_overrides, calls pretrain.
The recipe ``omni_like`` sets its mixed precision with fp32 reduction off, as the Omni 8-GPU
recipe does; ``preset_like`` names a preset string."""

from __future__ import annotations

import argparse

from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.mixed_precision import MixedPrecisionConfig
from megatron.bridge.training.pretrain import pretrain
from megatron.bridge.training.utils import omegaconf_utils


def recipe(name: str) -> ConfigContainer:
    if name == "omni_like":
        return ConfigContainer(
            mixed_precision=MixedPrecisionConfig(bf16=True, grad_reduce_in_fp32=False)
        )
    if name == "preset_like":
        return ConfigContainer(mixed_precision="bf16_mixed")
    raise AttributeError(
        f"Recipe '{name}' not found in megatron.bridge.recipes or megatron.bridge.perf_recipes."
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", required=True)
    args, overrides = p.parse_known_args()
    cfg = recipe(args.recipe)
    cfg = omegaconf_utils.process_config_with_overrides(cfg, cli_overrides=overrides)
    pretrain(cfg)


if __name__ == "__main__":
    main()
