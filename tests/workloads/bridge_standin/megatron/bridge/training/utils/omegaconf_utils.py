"""Hydra-style ``a.b=value`` overrides onto the config's dataclasses (a sub-field of a field
that holds a string, a preset name, cannot be set, as with OmegaConf)."""

from __future__ import annotations

import dataclasses

import yaml


def process_config_with_overrides(config, config_filepath=None, cli_overrides=None):  # noqa: ANN001, ANN201
    for item in cli_overrides or []:
        key, _, raw = item.partition("=")
        *path, last = key.lstrip("+").split(".")
        obj = config
        for part in path:
            obj = getattr(obj, part)
        if path and not dataclasses.is_dataclass(obj):
            raise ValueError(f"Could not override '{item}': {'.'.join(path)} is {obj!r}")
        setattr(obj, last, yaml.safe_load(raw))
    return config
