"""The knob facts live on the ``Knob`` (dse/space/knobs.py): MoE-only, the prior's preference, the
CloudAI names and the progress abbreviation. The rules, the prior, the CloudAI importer and
exporter and the progress lines read them there; these tests change a fact on the catalog
entry and see the reader follow, and check the facts for consistency."""

from __future__ import annotations

import dataclasses

import pytest

from dse.agents import _prior
from dse.interop.cloudai import BRIDGE_KNOBS, NEMO_RUN_KNOBS
from dse.loop.dispatch import short_params
from dse.model.rules import check
from dse.space import knobs
from dse.space.knobs import CLOUDAI_TEMPLATES, KNOBS, Preference
from tests.conftest import small_space


def test_the_prior_is_the_catalogs_preferences() -> None:
    assert set(_prior.PRIORS) == {n for n, k in KNOBS.items() if k.prefer is not None}
    # a changed preference on the Knob is what the prior reads
    mbs = KNOBS["micro_batch_size"]
    flipped = dataclasses.replace(mbs, prefer=Preference("smaller", 0.5, memory="larger"))
    prior = _prior.prior_of(flipped)
    assert prior is not None and prior.weight == 0.5
    domain = [1, 2, 4, 8]
    assert prior.pref(1, domain) == 1.0 and prior.pref(8, domain) == 0.0
    assert _prior.PRIORS["micro_batch_size"].pref(8, domain) == 1.0  # the catalog's own
    assert prior.mem is not None and prior.mem(8) > prior.mem(1)
    table = _prior.prior_of(dataclasses.replace(mbs, prefer=Preference({2: 0.9}, 1.0)))
    assert table is not None and table.pref(2, domain) == 0.9 and table.pref(4, domain) == 0.5
    assert _prior.prior_of(dataclasses.replace(mbs, prefer=None)) is None


@pytest.mark.parametrize("name", [n for n, k in KNOBS.items() if k.moe_only and k.kind == "bool"])
def test_a_moe_only_switch_on_a_dense_model_is_rejected_naming_it(name: str) -> None:
    dense = small_space("dense", {name: {"type": "bool"}})
    assert dense.model.num_moe_experts is None
    violations = check(dense, {name: True})
    assert violations, name
    assert any(name in v.message or name in v.values for v in violations), violations
    assert check(dense, {name: False}) == []


def test_the_moe_only_rule_follows_the_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    from dse.model import rules

    dense = small_space("dense", {"moe_grouped_gemm": {"type": "bool"}})
    assert [v.rule for v in check(dense, {"moe_grouped_gemm": True})] == ["moe_only"]
    monkeypatch.setattr(rules, "_MOE_SWITCHES", ())
    assert check(dense, {"moe_grouped_gemm": True}) == []


def test_cloudai_names_are_the_catalogs() -> None:
    want = {
        t: {k.cloudai[t]: n for n, k in KNOBS.items() if t in k.cloudai} for t in CLOUDAI_TEMPLATES
    }
    assert NEMO_RUN_KNOBS == want["NeMoRun"] and BRIDGE_KNOBS == want["MegatronBridge"]
    for name, k in KNOBS.items():
        assert set(k.cloudai) <= set(CLOUDAI_TEMPLATES), name
    for t in CLOUDAI_TEMPLATES:  # one knob per CloudAI name
        names = [k.cloudai[t] for k in KNOBS.values() if t in k.cloudai]
        assert len(names) == len(set(names)), t


def test_progress_lines_use_the_catalogs_abbreviations(monkeypatch: pytest.MonkeyPatch) -> None:
    assert short_params({"micro_batch_size": 4, "recompute": "full"}) == "mbs=4 recompute=full"
    abbrevs = [k.abbrev for k in KNOBS.values() if k.abbrev]
    assert len(abbrevs) == len(set(abbrevs))
    renamed = dataclasses.replace(KNOBS["recompute"], abbrev="rc")
    monkeypatch.setitem(knobs.KNOBS, "recompute", renamed)  # type: ignore[index]
    assert short_params({"recompute": "full"}) == "rc=full"
