"""Packed sequences in the built-in trainer (issue 38): on a CPU Megatron-Core's local
DotProductAttention takes no ``packed_seq_params`` (THD), so the trainer packs through a
block-diagonal causal mask with per-sequence position ids. These tests fail if a packed
trial trains its rows unpacked, or if the mask is not the sequences trained one by one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO, needs_megatron
from tests.workloads.test_megatron_trainer import losses, make_spec, run_trial

PACKED = {"packed_sequences": True}


@needs_megatron
def test_synthetic_packed_rows_end_their_sequences_and_mask_across_them() -> None:
    from dse.space.searchspace import DataSpec
    from dse.workloads.megatron._data import (
        PACKED_SYNTHETIC_LENGTHS,
        GlobalBatches,
        eod_id,
        packed_rows_stats,
    )

    data = GlobalBatches(DataSpec(kind="synthetic", seed=3), global_batch_size=4,
                         seq_length=64, vocab_size=1024, packed=True)  # fmt: skip
    batch = data.global_batch(0)
    assert batch.equal(data.global_batch(0)) and not batch.equal(data.global_batch(1))
    eod = eod_id(1024)
    lo, hi = (int(64 * f) for f in PACKED_SYNTHETIC_LENGTHS)
    for row in batch[:, :-1]:
        ends = [i + 1 for i, t in enumerate(row.tolist()) if t == eod]
        assert ends, "a packed row without a sequence boundary trains unpacked"
        lengths = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        assert all(lo <= n <= hi for n in lengths)
    rows, seqs = packed_rows_stats(batch, 1024)
    assert rows == 4 and seqs > 2 * rows
    micro = data.microbatches(batch, dp_rank=0, dp_size=1, micro_batch_size=1)
    tokens, labels, att, loss_mask, pos = micro[0]
    first_end = int((tokens[0] == eod).nonzero()[0])
    # a token after the first sequence sees none of it; positions restart; the loss of the
    # prediction made from an end-of-document input is masked
    assert bool(att[0, 0, first_end + 1, : first_end + 1].all())
    assert not bool(att[0, 0, first_end, : first_end + 1].any())
    assert int(pos[0, first_end + 1]) == 0 and float(loss_mask[0, first_end]) == 0.0
    unpacked = GlobalBatches(DataSpec(kind="synthetic", seed=3), global_batch_size=4,
                             seq_length=64, vocab_size=1024)  # fmt: skip
    assert len(unpacked.microbatches(unpacked.global_batch(0), dp_rank=0, dp_size=1,
                                     micro_batch_size=1)[0]) == 2  # fmt: skip


@pytest.fixture(scope="module")
def packed_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The equivalence check of three packed configurations (one process) and the packed
    trial of the first, trained by the trainer (one process)."""
    tmp = tmp_path_factory.mktemp("packed")
    cases = {
        "unfused_rope": ({}, {}),
        "sdpa_rope": ({"attention_backend": "sdpa"}, {}),
        "unfused_learned": ({}, {"position_embedding_type": "learned_absolute"}),
    }
    paths = []
    for name, (params, model) in cases.items():
        spec = make_spec(tmp, name, params, model=model, semantics=PACKED)
        path = tmp / f"{name}.json"
        path.write_text(spec.model_dump_json())
        paths.append(str(path))
    out = tmp / "check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.workloads.packed_check", "--out", str(out), *paths],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rc, trial = run_trial(make_spec(tmp, "trial", semantics=PACKED), tmp, torchrun=False)
    assert rc == 0
    return {"check": json.loads(out.read_text()), "trial": trial}


@pytest.mark.slow
@needs_megatron
@pytest.mark.parametrize("name", ["unfused_rope", "sdpa_rope", "unfused_learned"])
def test_a_packed_row_trains_as_its_sequences_one_by_one(
    packed_runs: dict[str, Any], name: str
) -> None:
    got = packed_runs["check"][name]
    assert got["sequences"] > 1
    # the same per-token losses and gradients as the sequences trained separately ...
    assert got["loss_diff_separate"] < 1e-5
    assert got["grad_rel_diff_separate"] < 1e-5
    # ... and not those of the row trained as one sequence
    assert got["loss_diff_unmasked"] > 1e-2


@pytest.mark.slow
@needs_megatron
def test_a_packed_trial_trains_the_masked_batch_not_the_unpacked_one(
    packed_runs: dict[str, Any],
) -> None:
    check, trial = packed_runs["check"]["unfused_rope"], packed_runs["trial"]
    first = losses(trial)[0]  # step 0: the initial weights on step 0's batch
    # matched to 1e-5 (seen: 2e-7); the unpacked loss of the same tokens is 30x further off
    # (seen: 6.7e-4: at the initial weights every loss is near ln(vocab))
    assert first == pytest.approx(check["batch_loss_step0"], abs=1e-5)
    assert abs(first - check["batch_loss_step0_unpacked"]) > 3e-4
    packing = trial.metrics["packing"]
    assert packing["sequences"] > 2 * packing["rows"] > 0
    assert "block-diagonal" in packing["path"] and "no PackedSeqParams" in packing["path"]
