"""One canonical configuration: a knob that does nothing under the others' values (a
conditional knob whose condition is false, a value Megatron-Core does not read) is left out
of the stored best, every export (Megatron-LM, Bridge, NeMo, CloudAI) and the dashboard's
trial rows, all through ``SearchSpace.inactive_knobs``; the Megatron-LM export refuses only
a value that changes what runs. On the Nemotron Omni space (examples/nemotron_omni.yaml),
whose fixed ``moe_flex_dispatcher_num_sms: 16`` is read by the flex dispatcher only."""

from __future__ import annotations

import json
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from dse.cli.main import main
from dse.core.records import Outcome
from dse.space.knobs import KNOBS, assignments
from dse.space.searchspace import SearchSpace, load_space, params_key
from dse.storage import open_storage
from tests.conftest import EXAMPLES

OMNI = EXAMPLES / "nemotron_omni.yaml"
FORMATS = ("json", "megatron", "bridge", "nemo")


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _store_best(tmp_path: Path, space: SearchSpace, params: dict[str, Any]) -> str:
    url = f"sqlite:///{tmp_path}/best.db"
    with open_storage(url) as st:
        rec = st.create_study(space_yaml=OMNI.read_text(), **space.study_fields())
        t = st.claim_trial(study_id=rec.id, params=params, params_key=params_key(params),
                           budget=9)  # fmt: skip
        assert t is not None
        st.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": 1.0}), value=1.0)
    return url


def _words(name: str, value: Any) -> set[str]:
    """The spellings of a knob's fields in the three launchers' texts."""
    out = {name, name.replace("_", "-")}
    for a in assignments({name: value}):
        out |= {a.field, a.field.replace("_", "-")}
    return out


def _tuned(space: SearchSpace) -> dict[str, Any]:
    return space.canonical({**space.baseline(), **space.agent.warm_start[0]})


def test_the_omni_baseline_drops_what_does_nothing() -> None:
    space = load_space(OMNI)
    base = space.baseline()
    dead = space.inactive_knobs(base)
    # the alltoall dispatcher reads neither flex field; no recompute reads no module list;
    # the precision-aware optimizer's dtypes are conditional on it (off)
    assert {"moe_flex_dispatcher_num_sms", "moe_flex_dispatcher_backend", "recompute_modules",
            "main_grads_dtype", "store_param_remainders"} <= dead  # fmt: skip
    active = space.active_config(base)
    assert not dead & set(active)
    assert active["expert_model_parallel_size"] == 8 and active["recompute"] == "none"
    # the hand-tuned configuration: flex + selective recompute, the same knobs are live
    tuned = _tuned(space)
    live = space.active_config(tuned)
    assert live["moe_flex_dispatcher_num_sms"] == 16
    assert live["recompute_modules"] == "moe,layernorm"
    assert live["moe_flex_dispatcher_backend"] == "hybridep"
    assert "moe_flex_dispatcher_num_sms" not in space.inactive_knobs(tuned)


def test_every_export_of_the_baseline_carries_no_dead_value(tmp_path: Path) -> None:
    space = load_space(OMNI)
    base = space.baseline()
    url = _store_best(tmp_path, space, base)
    dead = space.inactive_knobs(base)
    full = space.full_params(base)
    for fmt in FORMATS:
        rc, out, err = _run(["best", "--storage", url, "--format", fmt])
        # Megatron-LM: nothing left that changes what runs and has no flag
        assert rc == 0, (fmt, err)
        if fmt == "json":
            assert not dead & set(json.loads(out)["params"])
            continue
        for name in dead:
            for w in _words(name, full[name]):
                assert w not in out, (fmt, name, w)
    rc, out, err = _run(["cloudai", "export", "--storage", url])
    assert rc == 0, err
    assert "num_sms" not in out and "main_grads_dtype" not in out
    assert 'recompute_modules = "[]"' in out  # no recompute, said as CloudAI says it


def test_the_megatron_export_refuses_only_a_value_that_changes_what_runs(
    tmp_path: Path,
) -> None:
    space = load_space(OMNI)
    url = _store_best(tmp_path, space, _tuned(space))  # the flex dispatcher reads the SMs
    rc, out, err = _run(["best", "--storage", url, "--format", "megatron"])
    assert rc != 0 and out == ""
    assert "moe_flex_dispatcher_num_sms=16" in err and "Megatron-LM" in err
    rc, out, _ = _run(["best", "--storage", url, "--format", "bridge"])
    assert rc == 0
    assert "model.moe_flex_dispatcher_num_sms=16" in out
    assert "'model.recompute_modules=[moe,layernorm]'" in out


@pytest.mark.slow
def test_the_omni_sim_study_shows_and_exports_no_dead_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'omni.db'}"
    rc, _, err = _run(["start", "--space", str(OMNI), "--workload", "sim", "--n-trials", "6",
                       "--storage", url, "--workdir", str(tmp_path / "runs")])  # fmt: skip
    assert rc == 0, err
    space = load_space(OMNI)
    rc, out, _ = _run(["best", "--storage", url, "--format", "json"])
    assert rc == 0
    best = json.loads(out)["params"]
    assert not space.inactive_knobs(best) & set(best)  # the best is its active configuration
    assert "moe_flex_dispatcher_num_sms" not in best or best["moe_token_dispatcher_type"] == "flex"
    with open_storage(url) as st:
        trials = st.list_trials(st.list_studies()[0].id)
    raw = next(t.params for t in trials if t.number == json.loads(out)["trial"])
    dropped = space.inactive_knobs(raw)
    # exactly the dead knobs and fixed values of the trial left out
    assert set(space.full_params(raw)) - set(best) == dropped
    for fmt in ("megatron", "bridge", "nemo"):
        rc, text, err = _run(["best", "--storage", url, "--format", fmt])
        if rc != 0:  # refused: a live value, not at Megatron-Core's default
            knob = err.split("dse: ", 1)[1].split("=", 1)[0]
            assert knob in best and knob not in dropped, err
            assert best[knob] != KNOBS[knob].default, err
            continue
        full = space.full_params(raw)
        for name in dropped:
            for w in _words(name, full[name]):
                assert w not in text, (fmt, name)
    # the dashboard's trial rows: each trial's knobs without its dead ones
    from dse.api.views import study_space, trial_row

    with open_storage(url) as st:
        study = st.list_studies()[0]
        sp = study_space(study)
        for t in st.list_trials(study.id):
            row = trial_row(t, sp)["params"]
            assert not space.inactive_knobs(t.params) & set(row)
            assert set(row) <= set(t.params)
