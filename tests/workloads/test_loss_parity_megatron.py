"""The loss-parity guard on real Megatron-Core training (CPU, gloo, 2 ranks, tiny GPT, fp32).

Every configuration trains 4 steps of a tiny GPT on the same seeded batches from the same
initial weights (the built-in trainer). Execution knobs (micro-batch size, tensor parallelism,
full recompute) agree with the baseline to ~1e-6 and are not flagged; what changes the
trained model is: another data seed (``semantics.data.seed``), another initialisation seed
(``semantics.seed``), and another loss computation, dropout on the hidden states
(``TransformerConfig.hidden_dropout``: the loss is computed through dropout masks).

Megatron-Core's loss-scale settings are numerically neutral by design and are no fixture
here: a static ``OptimizerConfig.loss_scale`` multiplies the loss before backward and the
gradients are unscaled before the optimizer step (exact for powers of two), and
``calculate_per_token_loss`` divides by the token count after the reduction instead of per
micro-batch, the same sum for the equal-length, unmasked micro-batches of this trainer.

The data is a learnable token stream (a repeated 97-token motif, ``data.kind: path``) at a
learning rate of 1e-2, so the loss falls within 4 steps and a change of the model shows; the
data-seed case uses the synthetic stream. All configurations run in one torchrun job
(``parity_trials.py``): one start-up, a few seconds per configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dse.core.records import Outcome, TrialRecord, TrialSpec, read_metrics
from dse.loop.context import StudyContext
from dse.loop.loss_guard import LossGuard
from dse.space.searchspace import params_key, parse_space
from dse.stats.numerics import floor_of, judge, losses_of, tolerance_of
from dse.storage import open_storage
from tests.conftest import require_megatron

HERE = Path(__file__).resolve().parent
MODEL = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
         "ffn_hidden_size": 128, "vocab_size": 1024}  # fmt: skip
SEM = {"global_batch_size": 8, "seq_length": 64, "steps": 4, "warmup_steps": 1,
       "precision": "fp32", "lr": 1e-2}  # fmt: skip
KNOBS = {"tensor_model_parallel_size": 1, "micro_batch_size": 1, "recompute": "none"}

#: name -> (knob values, semantics, model); "path" data unless the semantics say otherwise
CONFIGS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "baseline": ({}, {}, {}),
    "mbs2": ({"micro_batch_size": 2}, {}, {}),
    "tp2": ({"tensor_model_parallel_size": 2}, {}, {}),
    "full_recompute": ({"recompute": "full"}, {}, {}),
    "dropout": ({}, {}, {"hidden_dropout": 0.1}),
    "init_seed": ({}, {"seed": 99}, {}),
    "synthetic": ({}, {"data": {"kind": "synthetic", "seed": 1234}}, {}),
    "synthetic_seed": ({}, {"data": {"kind": "synthetic", "seed": 99}}, {}),
}
EXECUTION = ("mbs2", "tp2", "full_recompute")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every configuration of CONFIGS, trained once (one torchrun job, 2 ranks)."""
    require_megatron()
    import numpy as np

    tmp = tmp_path_factory.mktemp("parity")
    motif = np.random.default_rng(0).integers(0, MODEL["vocab_size"], size=97)
    np.save(tmp / "tokens.npy", np.tile(motif, 200).astype(np.int32))
    data = {"kind": "path", "path": str(tmp / "tokens.npy")}
    paths = []
    for name, (knobs, sem, model) in CONFIGS.items():
        spec = TrialSpec(
            study="parity", trial_number=0, params={**KNOBS, **knobs},
            model={**MODEL, **model}, semantics={**SEM, "data": data, **sem}, world_size=2,
            device="cpu", metrics_path=str(tmp / f"{name}.jsonl"), features=[],
        )  # fmt: skip
        p = tmp / f"{name}.json"
        p.write_text(spec.model_dump_json())
        paths.append(str(p))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(HERE / "parity_trials.py"), *paths]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    out: dict[str, Outcome] = {}
    for name in CONFIGS:
        o = read_metrics(tmp / f"{name}.jsonl")
        assert o is not None and o.ok, f"{name}: {o}\nrc={proc.returncode}\n{proc.stderr[-3000:]}"
        out[name] = o
    return out


def _record(o: Outcome, number: int = 0) -> TrialRecord:
    return TrialRecord(number, 1, number, "complete", {}, "", dict(o.metrics), steps=o.steps)


@pytest.mark.slow
def test_the_model_learns_so_a_change_of_model_would_show(runs: dict[str, Outcome]) -> None:
    loss = runs["baseline"].metrics["losses"]
    assert loss[0] == pytest.approx(6.94, abs=0.02) and min(loss[1:]) < loss[0] - 0.4


@pytest.mark.slow
def test_execution_knobs_are_not_flagged_through_the_controllers_guard(
    runs: dict[str, Outcome], tmp_path: Path
) -> None:
    """The trials stored as a study's, judged where the controller judges them (storage is
    the source of the baseline's losses): MBS 2, TP 2 and full recompute are ok."""
    space = parse_space(
        {"study": "parity", "model": MODEL, "semantics": SEM,
         "resources": {"world_size": 2, "device": "cpu", "features": []},
         "knobs": {"tensor_model_parallel_size": {"values": [1, 2]},
                   "micro_batch_size": {"values": [1, 2]},
                   "recompute": {"values": ["none", "full"]}}},
        "parity.yaml",
    )  # fmt: skip
    with open_storage(f"sqlite:///{tmp_path / 'p.db'}") as st:
        rec = st.create_study(space_yaml="{}", **space.study_fields())
        guard = LossGuard(StudyContext(space, st, rec.id))
        verdicts = {}
        for name in ("baseline", *EXECUTION):
            params = {**KNOBS, **CONFIGS[name][0]}
            t = st.claim_trial(study_id=rec.id, params=params, params_key=params_key(params),
                               budget=9)  # fmt: skip
            assert t is not None
            o = runs[name]
            done = st.finish_trial(t.id, o, value=o.metrics["tflops_per_gpu"])
            verdicts[name] = guard.on_finished(done).metrics["numerics"]
    assert verdicts["baseline"]["status"] == "baseline"
    for name in EXECUTION:
        v = verdicts[name]
        assert v["status"] == "ok" and v["steps_compared"] == 4, (name, v)
        assert v["drift"] < 1e-5 and v["tolerance"] == 0.001, (name, v)  # the fp32 floor


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "reference", "at_least"),
    [
        ("dropout", "baseline", 0.01),  # another loss computation
        ("init_seed", "baseline", 0.01),  # other initial weights
        ("synthetic_seed", "synthetic", 0.001),  # other batches (random tokens: ~ln V each)
    ],
)
def test_a_change_of_the_trained_model_is_flagged(
    runs: dict[str, Outcome], name: str, reference: str, at_least: float
) -> None:
    tol = tolerance_of(floor_of(None, "fp32"), 3.0, [])
    ref = losses_of(_record(runs[reference]))
    v = judge(losses_of(_record(runs[name])), ref, baseline_trial=0, tol=tol)
    assert v["status"] == "changed" and v["drift"] > at_least, v
    # the same data and weights: the execution knobs stay far inside the same tolerance
    for other in EXECUTION:
        assert judge(losses_of(_record(runs[other])), losses_of(_record(runs["baseline"])),
                     baseline_trial=0, tol=tol)["status"] == "ok"  # fmt: skip
