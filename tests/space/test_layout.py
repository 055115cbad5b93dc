"""One layout and one set of rules: before launch, in the cost model, in space constraints
and in the trial process (dse.space.layout, dse.model.rules, dse/workloads/megatron/_plan.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dse.core.records import MetricsWriter, TrialSpec, read_metrics
from dse.model import rules
from dse.model.costmodel._layout import resolve as cost_resolve
from dse.space.layout import Layout
from dse.space.searchspace import SearchSpace, parse_space
from dse.workloads.megatron._plan import TrialFailure, make_plan
from dse.workloads.megatron.trainer import _Dist, run_trial


def _spec(space: SearchSpace, params: dict[str, Any], tmp: Path) -> TrialSpec:
    """The trial spec the study loop writes for ``params`` (fixed knobs included)."""
    return TrialSpec(
        study=space.study,
        trial_number=0,
        params=space.full_params(params),
        model=space.model.model_dump(),
        semantics=space.semantics.model_dump(),
        world_size=space.resources.world_size,
        device=space.resources.device,
        metrics_path=str(tmp / "metrics.jsonl"),
        features=[],
    )


def test_resolve_has_one_default_policy(tiny_space_dict: dict) -> None:
    s = parse_space(tiny_space_dict)
    lay = Layout.resolve(s.model, s.semantics, s.resources, {})
    assert (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.vpp) == (1, 1, 1, 1, 1, None)
    assert (lay.dp, lay.edp, lay.mbs, lay.num_microbatches) == (2, 2, 1, 4)
    # None is the catalog default, like an absent knob; ETP follows TP
    lay = Layout.resolve(
        s.model,
        s.semantics,
        4,
        {"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": None},
    )
    assert (lay.etp, lay.dp, lay.edp) == (2, 2, 2)
    # a world that the grid does not divide has no DP (the rules say why)
    lay = Layout.resolve(s.model, s.semantics, 3, {"tensor_model_parallel_size": 2})
    assert (lay.dp, lay.num_microbatches) == (0, 0)


@pytest.mark.parametrize(
    "params",
    [
        {"tensor_model_parallel_size": 1, "micro_batch_size": 2},
        {"tensor_model_parallel_size": 2, "micro_batch_size": 4},
        {"tensor_model_parallel_size": 2, "micro_batch_size": 1},
    ],
)
def test_every_layer_sees_the_same_layout(
    tiny_space_dict: dict, params: dict[str, Any], tmp_path: Path
) -> None:
    d = {**tiny_space_dict, "constraints": ["dp * micro_batch_size <= 8"]}
    s = parse_space(d)
    core = rules.layout(s, params)
    cost = cost_resolve(s.model, s.semantics, s.resources, s.full_params(params))
    plan = make_plan(_spec(s, params, tmp_path), [])
    assert cost.parallel == core
    assert plan.layout == core
    assert s.constraint_values(params) == [("dp * micro_batch_size <= 8", core.dp * core.mbs <= 8)]


def _mbs_divides_ffn(
    s: rules.RuleContext, p: dict, L: Layout, f: set[str] | None
) -> rules.Violation | None:
    """A rule a test adds once: ffn_hidden_size % (MBS * 64) == 0."""
    if s.model.ffn_hidden_size % (L.mbs * 64):
        return rules.Violation(
            "mbs_ffn",
            "ffn_hidden_size must be divisible by 64*MBS",
            {"ffn_hidden_size": s.model.ffn_hidden_size, "micro_batch_size": L.mbs},
        )
    return None


def test_a_rule_added_once_is_enforced_before_launch_and_in_the_trial(
    tiny_space_dict: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(rules.RULES, "mbs_ffn", _mbs_divides_ffn)
    s = parse_space(tiny_space_dict)
    params = {"tensor_model_parallel_size": 1, "micro_batch_size": 4}  # 128 % 256 != 0
    before = rules.check(s, params, [])
    assert [v.rule for v in before] == ["mbs_ffn"]
    spec = _spec(s, params, tmp_path)
    monkeypatch.setenv("WORLD_SIZE", str(spec.world_size))  # rank 0 of the trial's ranks
    with pytest.raises(TrialFailure) as err:  # raised before any process group starts
        run_trial(spec, _Dist(), MetricsWriter(spec.metrics_path))
    assert err.value.failure_class == "invalid"
    assert err.value.reason == str(before[0])
    # a configuration the rule allows passes both
    ok = {"tensor_model_parallel_size": 1, "micro_batch_size": 2}
    assert rules.check(s, ok, []) == []
    make_plan(_spec(s, ok, tmp_path), [])


def test_trial_process_reports_the_pre_launch_text(tiny_space_dict: dict, tmp_path: Path) -> None:
    """A real trial process (no torch needed: it stops at the rules) writes the violation
    with the rule's name and the same text as the pre-launch check."""
    d = {
        **tiny_space_dict,
        "semantics": {**tiny_space_dict["semantics"], "global_batch_size": 6},
        "resources": {**tiny_space_dict["resources"], "world_size": 1},
    }
    s = parse_space(d)
    params = {"tensor_model_parallel_size": 1, "micro_batch_size": 4}  # 6 % 4 != 0
    before = rules.check(s, params, [])
    assert [v.rule for v in before] == ["gbs_divisible"]
    spec = _spec(s, params, tmp_path)
    path = tmp_path / "trial.json"
    path.write_text(spec.model_dump_json())
    proc = subprocess.run(
        [sys.executable, "-m", "dse.workloads.megatron.trainer", "--spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    out = read_metrics(spec.metrics_path)
    assert out is not None and out.failure_class == "invalid"
    assert out.reason == str(before[0])
    assert (out.reason or "").startswith("gbs_divisible: global_batch_size must be divisible")
