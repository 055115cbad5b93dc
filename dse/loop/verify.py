"""``dse verify``: a study's best (and its baseline) validated by a long run.

Each configuration trains ``steps`` steps with the built-in trainer in a process of its own
(:mod:`dse.workloads.megatron.verify`, the space's fixed environment), a checkpoint saved
midway and reloaded; the verdict is ``verified`` or names each thing that failed: a run that
failed, a checkpoint reload that changed the loss, a best whose last loss drifts from the
baseline's by more than :data:`DRIFT_RTOL`. The result is stored with the study (study
attribute :data:`VERIFY_ATTR`) and shown by ``dse verify``, ``dse status`` and
``GET /api/v1/studies/{name}/verify``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dse.core.records import VERIFY_ATTR
from dse.loop.launcher import trial_spec
from dse.results.export import best_payload, best_space
from dse.space.searchspace import params_key

#: Largest relative difference of the best's last loss from the baseline's that verifies
#: (the same data and semantics: execution knobs should not move the loss).
DRIFT_RTOL = 0.01
DEFAULT_STEPS = 100


def _run_one(
    space: Any, params: dict[str, Any], steps: int, tmp: Path, tag: str
) -> dict[str, Any]:
    spec = trial_spec(space, params, tmp / f"{tag}.metrics.jsonl")
    if spec.device != "cpu" or spec.world_size != 1:
        return {
            "steps": steps,
            "error": f"dse verify runs one CPU rank here; the study has device={spec.device}, "
            f"world_size={spec.world_size}",
            "reload_ok": False,
        }
    spec_path, out = tmp / f"{tag}.spec.json", tmp / f"{tag}.out.json"
    spec_path.write_text(spec.model_dump_json())
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (space.env.fixed or {}).items()})
    cmd = [sys.executable, "-m", "dse.workloads.megatron.verify"]
    cmd += ["--spec", str(spec_path), "--steps", str(steps), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if not out.exists():
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return {
            "steps": steps,
            "error": f"the verify process failed: {tail[0]}",
            "reload_ok": False,
        }
    result: dict[str, Any] = json.loads(out.read_text())
    result["params"] = dict(params)
    return result


def verdict(best: dict[str, Any], baseline: dict[str, Any] | None) -> tuple[str, list[str]]:
    """(``verified`` or ``failed``, the reasons, each naming the run and what failed)."""
    reasons: list[str] = []
    for tag, r in (("best", best), ("baseline", baseline)):
        if r is None:
            continue
        if r.get("error"):
            reasons.append(f"{tag}: {r['error']}")
        elif not r.get("reload_ok"):
            reasons.append(f"{tag}: {r.get('reload_reason') or 'checkpoint reload failed'}")
        elif not all(math.isfinite(x) for x in r.get("losses", [])):
            reasons.append(f"{tag}: a loss is not finite")
    if baseline is not None and not best.get("error") and not baseline.get("error"):
        drift = loss_drift(best, baseline)
        if drift is not None and abs(drift) > DRIFT_RTOL:
            reasons.append(
                f"best: last loss {best['last_loss']:.6g} drifts {drift:+.2%} from the "
                f"baseline's {baseline['last_loss']:.6g} (more than {DRIFT_RTOL:.0%})"
            )
    return ("failed" if reasons else "verified"), reasons


def loss_drift(best: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """Relative difference of the best's last loss from the baseline's."""
    a, b = best.get("last_loss"), baseline.get("last_loss")
    if a is None or b is None or b == 0:
        return None
    return float((a - b) / abs(b))


def verify_study(storage: Any, study: Any, steps: int = DEFAULT_STEPS) -> dict[str, Any]:
    """Run the long runs of ``study``'s best and baseline; store and return the result."""
    if steps < 4:
        raise ValueError(f"--steps must be at least 4 (got {steps})")
    payload = best_payload(storage, study)
    space = best_space(storage, study)
    best_params = storage.get_trial_by_number(study.id, payload["trial"], with_steps=False).params
    base_params = space.baseline()
    same = params_key(space.full_params(dict(best_params))) == params_key(
        space.full_params(dict(base_params))
    )
    with tempfile.TemporaryDirectory(prefix="dse-verify-") as d:
        tmp = Path(d)
        best = _run_one(space, best_params, steps, tmp, "best")
        baseline = None if same else _run_one(space, base_params, steps, tmp, "baseline")
    status, reasons = verdict(best, baseline)
    result = {
        "study": study.name,
        "best_trial": payload["trial"],
        "steps": steps,
        "best": best,
        "baseline": baseline,
        "best_is_baseline": same,
        "loss_drift": None if baseline is None else loss_drift(best, baseline),
        "verdict": status,
        "reasons": reasons,
    }
    storage.set_study_attr(study.id, VERIFY_ATTR, result)
    return result


def verify_table(result: dict[str, Any]) -> str:
    """The result as the seed PR's table: one row per configuration, then the verdict."""
    head = (
        f"{'run':<9} {'steps':>5} {'first loss':>10} {'last loss':>10} {'final-10 s':>10} "
        f"{'TFLOP/s':>9} {'peak GiB':>8}  reload"
    )
    lines = [head]
    rows = [("best", result["best"])]
    if result.get("baseline") is not None:
        rows.append(("baseline", result["baseline"]))
    for tag, r in rows:
        if r.get("error"):
            lines.append(f"{tag:<9} {r['steps']:>5}  failed: {r['error']}")
            continue
        lines.append(
            f"{tag:<9} {r['steps']:>5} {r['first_loss']:>10.5f} {r['last_loss']:>10.5f} "
            f"{r['final_step_time_s']:>10.4f} {r['final_tflops_per_gpu']:>9.4f} "
            f"{r['peak_mem_gib']:>8.3f}  {'ok' if r['reload_ok'] else 'FAILED'}"
        )
    drift = result.get("loss_drift")
    if result.get("best_is_baseline"):
        lines.append("the best is the baseline configuration: no drift to compare")
    elif drift is not None:
        lines.append(f"last-loss drift of the best against the baseline: {drift:+.4%}")
    clock = result["best"].get("step_clock", "wall")
    lines.append(
        f"(step time: median of the last 10 steps, {clock} clock; measured, one CPU rank)"
    )
    lines.append(f"verdict: {result['verdict']}")
    lines += [f"  - {r}" for r in result.get("reasons", [])]
    return "\n".join(lines)
