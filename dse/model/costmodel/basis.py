"""What an estimate stands on: its basis in measurements, a trust label and an error band.

Every estimate (``dse estimate``, a sim trial, the speed hint steering an agent) is made by
the same physics for any model; how far to trust it depends on what was measured near it.
The basis is the set of measured data the model was checked against
(:data:`BASIS_FILE`, written by ``scripts/derive_estimate_basis.py`` from the measured tables
in ``examples/tables/`` and the published figures in ``examples/published/``): per data set
its model family (``dense``, ``moe``, ``hybrid``), GPU, model size, layer kinds, the layout
range it covers (TP, PP, CP, EP, micro-batch size, recompute), the layouts it measured, and
the error bands of the estimate on it, taken from held-out rows (the speed estimate's scale
fitted on the even rows, its error checked on the odd ones; the memory estimate, which fits
nothing, checked on every row).

:func:`assess` labels a configuration:

``calibrated``
    a data set of the same architecture and GPU measured this very layout;
``interpolated``
    a data set of the same family and GPU, of a size within a factor
    :data:`SIZE_FACTOR`, covers every layout coordinate within its measured range and every
    layer kind of the model;
``extrapolated``
    otherwise: the label says which coordinate lies outside which data set's range, and the
    error band is unknown.

A study's own measured trials extend the basis (:func:`assess` takes them as ``measured``):
a configuration whose layout a trial of the study measured is ``calibrated``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from dse.model.costmodel._layout import resolve
from dse.model.costmodel._params import total_params
from dse.model.costmodel.throughput import gpu_spec
from dse.space.searchspace import ModelSpec, Resources, Semantics

__all__ = [
    "BASIS_FILE",
    "COORDINATES",
    "LABELS",
    "SIZE_FACTOR",
    "Trust",
    "assess",
    "basis_entries",
    "coordinates",
    "family",
    "fingerprint",
]

#: The basis, inside the package (re-derived by scripts/derive_estimate_basis.py).
BASIS_FILE = "estimate_basis.json"
#: Trust labels, from the most to the least trusted.
LABELS = ("calibrated", "interpolated", "extrapolated")
#: Layout coordinates a data set's range covers.
COORDINATES = ("tp", "pp", "cp", "ep", "mbs", "recompute")
#: Model sizes (parameters) a data set speaks for: within this factor of its own.
SIZE_FACTOR = 2.0


def family(model: ModelSpec) -> str:
    """``hybrid`` (a Mamba layer pattern), ``moe`` (routed experts) or ``dense``."""
    if model.is_hybrid:
        return "hybrid"
    return "moe" if model.num_moe_experts else "dense"


#: Multi-Latent Attention's shape fields, which mean nothing without it.
_MLA_FIELDS = {"q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"}


def fingerprint(model: ModelSpec) -> str:
    """The architecture as one string (two data sets of one model share it). A field added
    later counts only when set (``moe_layer_freq`` other than every layer; MLA's fields with
    ``multi_latent_attention``; ``qk_layernorm`` when on)."""
    exclude = {"seq_length"} | ({"moe_layer_freq"} if model.moe_layer_freq == 1 else set())
    if not model.multi_latent_attention:
        exclude |= _MLA_FIELDS | {"multi_latent_attention"}
    if not model.qk_layernorm:
        exclude.add("qk_layernorm")
    return json.dumps(model.model_dump(mode="json", exclude=exclude), sort_keys=True)


def coordinates(
    model: ModelSpec, semantics: Semantics, resources: Resources, params: Mapping[str, Any]
) -> dict[str, Any]:
    """The layout coordinates of a configuration (:data:`COORDINATES`)."""
    lay = resolve(model, semantics, resources, params)
    rc = lay.recompute
    if rc == "selective":
        rc = "selective:" + ",".join(sorted(lay.recompute_modules))
    return {
        "tp": lay.tp,
        "pp": lay.pp,
        "cp": lay.cp,
        "ep": lay.ep,
        "mbs": lay.mbs,
        "recompute": rc,
    }


def _kinds(model: ModelSpec) -> list[str]:
    return sorted(k for k, n in model.layer_counts().items() if n)


@dataclass(frozen=True)
class Trust:
    """How far an estimate is to be trusted (see the module docstring)."""

    label: str
    basis: tuple[str, ...] = ()
    memory_band: float | None = None
    speed_band: float | None = None
    why: str = ""
    coordinates: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "basis": list(self.basis),
            "memory_band": self.memory_band,
            "speed_band": self.speed_band,
            "why": self.why,
            "coordinates": dict(self.coordinates),
            "source": "estimate",
        }

    def describe(self) -> str:
        """One line: the label, the bands and what it stands on."""
        bands = []
        if self.speed_band is not None:
            bands.append(f"speed +-{100 * self.speed_band:.0f}%")
        if self.memory_band is not None:
            bands.append(f"memory +-{100 * self.memory_band:.0f}%")
        band = ", ".join(bands) if bands else "error band unknown"
        on = ", ".join(self.basis) if self.basis else "no measured data of this family"
        return f"{self.label} ({band}; basis: {on}){': ' + self.why if self.why else ''}"


@cache
def _load() -> tuple[dict[str, Any], ...]:
    text = resources.files("dse.model.costmodel").joinpath(BASIS_FILE).read_text()
    return tuple(json.loads(text)["entries"])


def basis_entries() -> list[dict[str, Any]]:
    """The data sets of the packaged basis."""
    return [dict(e) for e in _load()]


def _within(value: Any, lo_hi: Sequence[Any]) -> bool:
    return bool(lo_hi) and lo_hi[0] <= value <= lo_hi[1]


def _outside(coords: Mapping[str, Any], entry: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    ranges = entry["ranges"]
    for c in COORDINATES:
        v = coords[c]
        if c == "recompute":
            if v not in ranges[c]:
                out.append(f"recompute={v} not among the measured {ranges[c]}")
        elif not _within(v, ranges[c]):
            lo, hi = ranges[c]
            out.append(f"{c}={v} outside the measured {lo}..{hi}")
    return out


def assess(
    model: ModelSpec,
    semantics: Semantics,
    resources: Resources,
    params: Mapping[str, Any],
    measured: Iterable[Mapping[str, Any]] = (),
    entries: Sequence[Mapping[str, Any]] | None = None,
) -> Trust:
    """The trust label of the estimate of ``params`` (see the module docstring).

    ``measured``: full configurations the study measured (their layouts count as
    calibrated); ``entries``: the basis (default: the packaged one)."""
    coords = coordinates(model, semantics, resources, params)
    fam = family(model)
    gpu = gpu_spec(resources.gpu).name
    fp = fingerprint(model)
    for p in measured:
        if coordinates(model, semantics, resources, p) == coords:
            return Trust(
                "calibrated", ("this study's measured trials",), why="", coordinates=coords
            )
    ents = basis_entries() if entries is None else list(entries)
    same = [e for e in ents if e["family"] == fam and e["gpu"] == gpu]
    if not same:
        others = sorted({e["gpu"] for e in ents if e["family"] == fam})
        why = f"no measured {fam} model on {gpu}" + (
            f" (measured on {', '.join(others)})" if others else ""
        )
        return Trust("extrapolated", why=why, coordinates=coords)
    for e in same:
        if e["fingerprint"] == fp and [coords[c] for c in COORDINATES] in e["points"]:
            return Trust(
                "calibrated", (e["name"],), e.get("memory_band"), e.get("speed_band"), "", coords
            )
    size = total_params(model, semantics.seq_length)
    kinds = set(_kinds(model))
    reasons: list[str] = []
    for e in same:
        outside = _outside(coords, e)
        if not (e["params"] / SIZE_FACTOR <= size <= e["params"] * SIZE_FACTOR):
            outside.append(f"{size / 1e9:.2f}B parameters, measured {e['params'] / 1e9:.2f}B")
        missing = kinds - set(e["layer_kinds"])
        if missing:
            outside.append(f"layer kinds {sorted(missing)} not measured")
        if not outside:
            return Trust(
                "interpolated", (e["name"],), e.get("memory_band"), e.get("speed_band"), "", coords
            )
        reasons.append(f"{e['name']}: {'; '.join(outside)}")
    return Trust(
        "extrapolated",
        tuple(e["name"] for e in same),
        why=" | ".join(reasons),
        coordinates=coords,
    )
