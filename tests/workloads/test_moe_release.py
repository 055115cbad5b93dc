"""A warm worker frees a hybrid Mamba-MoE trial (issue 36): Megatron-Core 0.16.1's MoE token
dispatcher keeps the last micro-batch's routing probabilities with their autograd graph, whose
C++ nodes reach the gradient hooks of Megatron's DDP and so the whole model; Python's collector
cannot see that cycle, and on the H200 a worker kept 12.9-24 GiB after every hybrid trial. The
trainer now drops such tensors (``_speed.drop_graph_refs``). A real trial of a small hybrid
model (the proxy's pattern and routing) in a process of its own, run as the warm worker runs
it, then released: no tensor of the model stays reachable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLES

SCRIPT = r"""
import json, sys, tempfile
from pathlib import Path
from dse.core.records import TrialSpec
from dse.space.searchspace import load_space
from dse.workloads.megatron import trainer, worker
from dse.workloads.megatron._speed import live_tensors
import gc

space = load_space(sys.argv[1])
model = space.model.model_copy(update=dict(
    num_layers=4, hybrid_layer_pattern="M*EM", hidden_size=64, num_attention_heads=4,
    num_query_groups=2, kv_channels=16, ffn_hidden_size=128, vocab_size=256, num_moe_experts=4,
    moe_router_topk=2, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=64,
    mamba_num_heads=4, mamba_head_dim=16, mamba_state_dim=16, mamba_num_groups=2,
    mamba_chunk_size=32))
sem = space.semantics.model_copy(update=dict(seq_length=128, steps=2, warmup_steps=1))
dist = worker._init_device("cpu")
gc.collect(); gc.freeze()
d = Path(tempfile.mkdtemp())
params = space.full_params({**space.baseline(), "attention_backend": "unfused",
                            "use_mamba_mem_eff_path": False})
spec = TrialSpec(study="x", trial_number=0, params=params, model=model.model_dump(),
                 semantics=sem.model_dump(), world_size=1, device="cpu",
                 metrics_path=str(d / "m.jsonl"))
rc = trainer.run_spec(spec, dist)
trainer.release_trial_state("cpu")
last = json.loads((d / "m.jsonl").read_text().splitlines()[-1])
print(json.dumps({"rc": rc, "live": live_tensors(), "dropped": last.get("graph_refs_dropped")}))
"""


def test_a_hybrid_moe_trial_leaves_no_model_behind(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": "0"}
    env.pop("MASTER_PORT")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(EXAMPLES / "nemotron_h_proxy_h200.yaml")],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1])
    assert got["rc"] == 0 and got["dropped"] >= 1
    # before the fix: 340 tensors, 1.8 MiB (every weight and optimizer state of the model)
    assert got["live"]["cpu_mib"] < 0.01, got
