from __future__ import annotations

import copy
from pathlib import Path

import pytest

from dse.core.exceptions import SpaceError
from dse.space.searchspace import load_space, params_key, parse_space
from tests.conftest import EXAMPLES


def test_examples_load() -> None:
    for f in sorted(EXAMPLES.glob("*.yaml")):
        s = load_space(f)
        assert s.study
        assert s.size() >= 1


def test_baseline_defaults_and_explicit(tiny_space_dict: dict) -> None:
    s = parse_space(tiny_space_dict)
    assert s.baseline() == {
        "tensor_model_parallel_size": 1,
        "micro_batch_size": 1,
        "use_distributed_optimizer": False,
    }
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["micro_batch_size"]["baseline"] = 4
    assert parse_space(d).baseline()["micro_batch_size"] == 4


def test_size_and_iter(tiny_space_dict: dict) -> None:
    s = parse_space(tiny_space_dict)
    configs = list(s.iter_configs())
    # 12 combinations; at TP 2 on 2 ranks (DP 1) the distributed optimizer does nothing, so
    # its two values there are one configuration
    assert s.size() == 12 and len(configs) == 9
    assert len({params_key(c) for c in configs}) == 9


def test_conditions_canonicalize(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    del d["knobs"]["use_distributed_optimizer"]  # inert at TP 2 (DP 1): not what this tests
    d["knobs"]["sequence_parallel"] = {
        "type": "bool",
        "when": {"tensor_model_parallel_size": 2},
    }
    s = parse_space(d)
    configs = list(s.iter_configs())
    # SP only varies when TP=2: 3 (TP1) + 6 (TP2) distinct
    assert len(configs) == 9
    assert all(not c["sequence_parallel"] for c in configs if c["tensor_model_parallel_size"] == 1)


def test_int_log_domain(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["knobs"]["micro_batch_size"] = {"type": "int", "low": 1, "high": 8, "log": True}
    assert parse_space(d).knobs["micro_batch_size"].values() == [1, 2, 4, 8]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["model"].update(foo=1), "model.foo: Extra inputs are not permitted"),
        (
            lambda d: d["knobs"].update(tensor_model_paralel_size={"values": [1]}),
            "unknown knob 'tensor_model_paralel_size' "
            "(did you mean 'tensor_model_parallel_size'?)",
        ),
        (
            lambda d: d["knobs"]["micro_batch_size"].update(values=[0, 1]),
            "knobs.micro_batch_size: expected an integer >= 1, got 0",
        ),
        (lambda d: d["semantics"].update(warmup_steps=4), "warmup_steps must be smaller"),
        (lambda d: d["knobs"]["micro_batch_size"].update(baseline=3), "baseline 3 is not in"),
        (lambda d: d.update(constraints=["micro_batch_size <= foo"]), "'foo'"),
        (lambda d: d.update(constraints=["__import__('os')"]), "Call is not allowed"),
        (
            lambda d: d["semantics"].pop("global_batch_size"),
            "semantics.global_batch_size: Field required",
        ),
        (lambda d: d["model"].update(num_query_groups=3), "multiple of num_query_groups"),
        (lambda d: d.update(agent={"name": "bayes"}), "agent.name"),
    ],
)
def test_bad_input_names_field(tiny_space_dict: dict, mutate, expected: str) -> None:
    d = copy.deepcopy(tiny_space_dict)
    mutate(d)
    with pytest.raises(SpaceError) as ei:
        parse_space(d, "space.yaml")
    assert expected in str(ei.value)
    assert str(ei.value).startswith("space.yaml: ")


def test_yaml_error_has_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("study: x\nmodel: [1, 2\n")
    with pytest.raises(SpaceError, match=r"bad.yaml: not valid YAML at line \d+"):
        load_space(p)


def test_constraints_evaluated(tiny_space_dict: dict) -> None:
    d = copy.deepcopy(tiny_space_dict)
    d["constraints"] = ["micro_batch_size * tensor_model_parallel_size <= 4 and dp >= 1"]
    s = parse_space(d)
    ok = s.constraint_values({"micro_batch_size": 4, "tensor_model_parallel_size": 2})
    assert ok == [(d["constraints"][0], False)]
    ok = s.constraint_values({"micro_batch_size": 2, "tensor_model_parallel_size": 2})
    assert ok[0][1] is True


# --- measurement: identity or run setting ----------------------------------------------------


def _with_measurement(**measurement: object):
    data = load_space(EXAMPLES / "tiny_gpt_cpu.yaml").model_dump(mode="json")
    del data["measurement"]
    if measurement:
        data["measurement"] = measurement
    return parse_space(data, "t.yaml")


def test_measurement_defaults_keep_the_study_hash() -> None:
    """A space without the section, or with its defaults, is the same study as before the
    section existed (its identity has no measurement entry)."""
    plain = _with_measurement()
    same = _with_measurement(mode="fixed", rel_halfwidth=0.01, prune=False)
    assert "measurement" not in plain.identity()
    assert plain.identity_digest() == same.identity_digest()
    assert plain.digest() == same.digest()


def test_how_a_trial_measures_is_identity_pruning_is_a_run_setting() -> None:
    from dse.results.run_settings import identity_changes, run_settings, with_run_settings

    base = _with_measurement()
    adaptive = _with_measurement(mode="adaptive", min_steps=8, max_steps=40)
    assert identity_changes(base, adaptive) == ["measurement"]
    assert adaptive.identity()["measurement"]["max_steps"] == 40
    assert identity_changes(base, _with_measurement(rel_halfwidth=0.02)) == ["measurement"]
    pruning = _with_measurement(prune=True, prune_margin=0.1)
    assert identity_changes(base, pruning) == []
    assert base.identity_digest() == pruning.identity_digest()
    stored = run_settings(pruning)["measurement"]
    assert stored == {"prune": True, "prune_margin": 0.1}
    resumed = with_run_settings(base, run_settings(pruning), "stored")
    assert resumed.measurement.prune and resumed.measurement.prune_margin == 0.1
    # the identity part of the section stays the space file's
    back = with_run_settings(adaptive, run_settings(pruning), "stored")
    assert back.measurement.mode == "adaptive" and back.measurement.prune


def test_adaptive_launchers_run_up_to_max_steps() -> None:
    from dse.workloads.launchers import launcher_for

    data = load_space(EXAMPLES / "tiny_gpt_cpu_megatron_lm.yaml").model_dump(mode="json")
    data["measurement"] = {"mode": "adaptive", "min_steps": 6, "max_steps": 37}
    space = parse_space(data, "t.yaml")
    argv = launcher_for(space).render(space.full_params(space.baseline())).argv
    assert argv[argv.index("--train-iters") + 1] == "37"
