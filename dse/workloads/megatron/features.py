"""Which optional software features are present where a trial runs.

The names are those of :data:`dse.space.knobs.FEATURES`. Detection imports the package, so it
runs inside the trial process (or a probe process on the trial's machine), never in the
controller: importing Transformer Engine or DeepEP loads CUDA libraries.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

from dse.workloads.megatron import _mamba_kernels as mk

__all__ = ["FEATURE_PROBES", "detect_features", "has_feature"]


def _imports(module: str, attr: str | None = None) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            mod = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a broken install (missing .so, CUDA) counts as absent
            return False
        return attr is None or hasattr(mod, attr)

    probe.__doc__ = f"True when ``{module}``{'.' + attr if attr else ''} imports."
    return probe


#: feature name -> probe; the names match :data:`dse.space.knobs.FEATURES`.
FEATURE_PROBES: dict[str, Callable[[], bool]] = {
    "transformer_engine": _imports("transformer_engine.pytorch"),
    "apex": _imports("apex"),
    "deepep": _imports("deep_ep"),
    # HybridEP ships in DeepEP's ``hybrid-ep`` branch as ``deep_ep.HybridEPBuffer``.
    "hybridep": _imports("deep_ep", "HybridEPBuffer"),
    "flash_attn": _imports("flash_attn"),
    # Mamba layers: mamba-ssm's Triton SSD kernels, found the way Megatron-Core imports them
    "mamba_ssm": lambda: _mamba_ssm(),
}


def _mamba_ssm() -> bool:
    """True when mamba-ssm's Triton SSD scan and gated norm import as
    ``megatron/core/ssm/mamba_mixer.py`` imports them: ``import mamba_ssm`` itself fails
    without the CUDA build (``selective_scan_cuda``), yet leaves ``mamba_ssm.ops.triton``
    importable. dse's CPU torch reference does not count. Where the causal-conv1d package is
    installed without its CUDA extension, the labelled torch stand-in for that extension is
    registered first (before mamba-ssm binds it at import; see :mod:`._mamba_kernels`)."""

    if mk.conv1d_kind() == "absent" and mk.has_module("triton"):
        mk.install_conv1d_stand_in()
    return mk.ssd_kind() == "triton"


def has_feature(name: str) -> bool:
    """True when the named feature imports here; raises ``KeyError`` for an unknown name."""
    return FEATURE_PROBES[name]()


def detect_features() -> list[str]:
    """The features that import in this process, in :data:`FEATURE_PROBES` order."""
    return [name for name, probe in FEATURE_PROBES.items() if probe()]
