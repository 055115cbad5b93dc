"""Same losses: upstream Megatron-LM ``pretrain_gpt.py`` and the built-in trainer on the tiny
GPT (examples/tiny_gpt_cpu_megatron_lm_upstream.yaml, fp32, CPU), same seed and data, at MBS 1
and 2, agree per step within the loss guard's tolerance (its fp32 floor, 0.1 %).

The built-in side trains here (one torchrun job, tests/workloads/parity_trials.py) with
``data.kind: mock`` (megatron-core's ``MockGPTDataset`` as Megatron-LM builds it for
``--mock-data``) and ``semantics.init: megatron`` (Megatron-Core's own initialisation, what
upstream does). Upstream's side:

* always (CI included): its losses as upstream printed them, recorded by ``bench/upstream_mlm.py
  --cpu`` through bench/mlm_cpu_shim from Megatron-LM core_v0.16.1
  (tests/fixtures/logs/megatron_lm_v0161_cpu_tiny_gpt_mbs*.log), read by dse's own log parser;
* live, where ``$DSE_MEGATRON_LM_GIT`` names a git directory of a Megatron-LM clone (the
  convention of test_upstream_names.py; the clone is not part of this repository): upstream
  is extracted at core_v0.16.1 (bench/mlm_extract.sh) and run through the CPU shim by
  ``bench/upstream_mlm.py --cpu``, and its fresh losses are compared the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.core.records import Outcome, TrialSpec, read_metrics
from dse.space.searchspace import parse_space
from dse.stats.numerics import floor_of, judge, loss_drift, tolerance_of
from dse.workloads.logs import parse_log
from tests.conftest import EXAMPLES, LOGS, REPO, require_megatron, require_part

HERE = Path(__file__).resolve().parent
SPACE = EXAMPLES / "tiny_gpt_cpu_megatron_lm_upstream.yaml"
MBS = (1, 2)


def _space_data() -> dict[str, Any]:
    data = yaml.safe_load(SPACE.read_text())
    data["semantics"]["data"] = {"kind": "mock", "seed": data["semantics"].get("seed", 1234)}
    data["semantics"]["init"] = "megatron"
    return data


def _tolerance() -> Any:
    # the guard's own rule: the space's floor or its precision's, no repeat measured
    space = parse_space(_space_data())
    return tolerance_of(floor_of(None, space.semantics.precision), 3.0, [])


def _by_step(losses: list[float]) -> dict[int, float]:
    return dict(enumerate(losses))


def _recorded(mbs: int) -> dict[int, float]:
    text = (LOGS / f"megatron_lm_v0161_cpu_tiny_gpt_mbs{mbs}.log").read_text()
    return _by_step([s.loss for s in parse_log(text).steps if s.loss is not None])


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Outcome]:
    """The built-in trainer on the upstream space's trials at MBS 1 and 2."""
    require_megatron()
    tmp = tmp_path_factory.mktemp("upstream-parity")
    space = parse_space(_space_data())
    paths = []
    for mbs in MBS:
        spec = TrialSpec(
            study="parity", trial_number=mbs,
            params={**space.fixed, **space.baseline(), "micro_batch_size": mbs},
            model=space.model.model_dump(), semantics=space.semantics.model_dump(),
            world_size=1, device="cpu", metrics_path=str(tmp / f"mbs{mbs}.jsonl"), features=[],
            workload={"name": "megatron"},
        )  # fmt: skip
        p = tmp / f"mbs{mbs}.json"
        p.write_text(spec.model_dump_json())
        paths.append(str(p))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=1", str(HERE / "parity_trials.py"), *paths]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    out: dict[int, Outcome] = {}
    for mbs in MBS:
        o = read_metrics(tmp / f"mbs{mbs}.jsonl")
        why = f"MBS {mbs}: {o}\nrc={proc.returncode}\n{proc.stderr[-3000:]}"
        assert o is not None and o.ok, why
        assert o.metrics["init"] == "megatron"
        out[mbs] = o
    return out


def _losses(o: Outcome) -> dict[int, float]:
    return {s.step: float(s.loss) for s in o.steps if s.loss is not None}


def _assert_parity(upstream: dict[int, dict[int, float]], builtin: dict[int, Outcome]) -> None:
    tol = _tolerance()
    assert tol.value == 0.001  # the fp32 floor
    for mbs in MBS:
        ours = _losses(builtin[mbs])
        assert len(ours) == len(upstream[mbs]) == 4
        v = judge(ours, upstream[mbs], baseline_trial=0, tol=tol)
        assert v["status"] == "ok" and v["steps_compared"] == 4, (mbs, v, ours, upstream[mbs])
    # the same global batches whatever the micro-batching, on both sides
    for side in (upstream, {m: _losses(o) for m, o in builtin.items()}):
        drift, n = loss_drift(side[1], side[2])
        assert n == 4 and drift is not None and drift <= tol.value, side


@pytest.mark.slow
def test_builtin_losses_are_upstreams_recorded_ones(builtin: dict[int, Outcome]) -> None:
    upstream = {mbs: _recorded(mbs) for mbs in MBS}
    _assert_parity(upstream, builtin)
    # the model learns on the mock documents (a change of model would show), and agreement
    # is far inside the tolerance: the same initial weights and batches, step by step
    ours = _losses(builtin[1])
    assert ours[3] < ours[0] - 0.05
    drift, _ = loss_drift(upstream[1], ours)
    assert drift is not None and drift < 1e-5


@pytest.mark.slow
def test_builtin_losses_are_upstreams_run_live(
    builtin: dict[int, Outcome], tmp_path: Path
) -> None:
    git_dir = os.environ.get("DSE_MEGATRON_LM_GIT", "").strip()
    if not git_dir:
        pytest.skip("$DSE_MEGATRON_LM_GIT (a git directory of the upstream clone) is not set")
    # packages megatron/training imports that dse does not need (regex), from the
    # environment or a folder named by $DSE_MLM_EXTRA_SITE (bench/upstream_mlm.py --extra-site)
    extra = os.environ.get("DSE_MLM_EXTRA_SITE", "").strip()
    if importlib.util.find_spec("regex") is None and not extra:
        require_part("regex", "Megatron-LM's megatron/training imports it; install it or name "
                     "a folder holding it in $DSE_MLM_EXTRA_SITE")  # fmt: skip
    mlm = tmp_path / "mlm"
    subprocess.run(["bash", str(REPO / "bench" / "mlm_extract.sh"), git_dir], check=True,
                   cwd=tmp_path, env={**os.environ, "MLM_DIR": str(mlm)})  # fmt: skip
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(_space_data(), sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "upstream_mlm.py"), "--cpu", "--only", "upstream",
         "--space", str(space), "--set", "micro_batch_size=1,2", "--mlm", str(mlm),
         "--out", str(out), *(["--extra-site", extra] if extra else [])],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "rows.json").read_text())["upstream"]
    assert [t["state"] for ts in rows.values() for t in ts] == ["complete"] * 2, rows
    upstream = {}
    for trial in sorted((out / "runs").glob("*/trial-*")):  # each trial's log, as printed
        mbs = json.loads((trial / "trial.json").read_text())["params"]["micro_batch_size"]
        steps = parse_log((trial / "log.txt").read_text()).steps
        upstream[mbs] = _by_step([s.loss for s in steps if s.loss is not None])
    assert sorted(upstream) == list(MBS)
    _assert_parity(upstream, builtin)
    assert upstream == {mbs: _recorded(mbs) for mbs in MBS}  # the fixtures are still upstream's
