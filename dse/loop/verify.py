"""``dse verify``: a study's best (and its baseline) validated by a long run.

Each configuration trains ``steps`` steps as a trial of the study runs: the study's own
runner (``runner.name``: local, Slurm, Ray; :func:`dse.runners.make_runner`), the
trial's command (``torchrun`` of the built-in trainer, every rank), environment and launch
flags (:func:`dse.loop.dispatch.trial_launch`), plus the verify settings in the trial spec
(``workload.verify``), which make the trial process run the long run instead of a timed
trial: a checkpoint saved midway with Megatron-Core's ``dist_checkpointing`` and reloaded
(:mod:`dse.workloads.megatron.verify`). The runs go in ``<runner.workdir>/<study>/verify-best``
and ``verify-baseline``. The verdict is ``verified`` or names each thing that failed: a run
that failed, a checkpoint reload that changed the loss, a best whose last loss drifts from
the baseline's by more than :data:`DRIFT_RTOL`. The result is stored with the study (study
attribute :data:`VERIFY_ATTR`) and shown by ``dse verify``, ``dse status`` and
``GET /api/v1/studies/{name}/verify``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse.core.exceptions import TrialLaunchError
from dse.core.records import VERIFY_ATTR, Outcome, StudyRecord
from dse.loop.dispatch import trial_launch, trial_spec
from dse.loop.reconcile import Owner
from dse.results.best_formats import best_payload, best_space
from dse.runners import OWNER_ENV, BaseRunner, Launch, make_runner
from dse.space.searchspace import SearchSpace, params_key
from dse.workloads import trial_command

if TYPE_CHECKING:  # SQLAlchemy: loaded where a command opens its database
    from dse.storage import Storage

#: Largest relative difference of the best's last loss from the baseline's that verifies
#: (the same data and semantics: execution knobs should not move the loss).
DRIFT_RTOL = 0.01
DEFAULT_STEPS = 100
#: The workload whose trial process can run the long run (the built-in trainer).
VERIFY_WORKLOAD = "megatron"
POLL_S = 0.5


def run_timeout_s(space: SearchSpace, steps: int) -> float:
    """A long run's time limit: the trial's (``budget.trial_timeout_s``) scaled by the steps
    it trains (``steps`` and the reloaded half again) against a trial's steps."""
    trained = steps + steps - steps // 2
    return space.budget.trial_timeout_s * max(1.0, trained / max(1, space.semantics.steps))


def _failed(steps: int, why: str) -> dict[str, Any]:
    return {"steps": steps, "error": why, "reload_ok": False}


def _run_one(
    space: SearchSpace,
    runner: BaseRunner,
    owner: str,
    params: dict[str, Any],
    steps: int,
    workdir: Path,
    tag: str,
    key: int,
) -> dict[str, Any]:
    """The long run of ``params`` through ``runner``: its result, or its failure."""
    if space.workload.name != VERIFY_WORKLOAD:
        return _failed(
            steps,
            f"dse verify trains with the built-in Megatron-Core trainer (workload "
            f"{VERIFY_WORKLOAD!r}); this study's workload is {space.workload.name!r}",
        )
    env, workload = trial_launch(space, dict(params))
    workload["verify"] = {"steps": steps}
    tdir = (workdir / f"verify-{tag}").resolve()
    metrics = tdir / "metrics.jsonl"
    tdir.mkdir(parents=True, exist_ok=True)
    for old in (metrics, tdir / "log.txt"):
        old.unlink(missing_ok=True)
    spec = trial_spec(space, params, metrics, trial_number=key, workload=workload)
    spec_path = tdir / "trial.json"
    spec_path.write_text(spec.model_dump_json(indent=2))
    r = space.resources
    timeout = run_timeout_s(space, steps)
    launch = Launch(
        trial_id=-key,  # not a stored trial: a negative id
        number=key,
        argv=trial_command(
            space.workload.name,
            str(spec_path),
            world_size=r.world_size,
            python=space.runner.python,
        ),  # fmt: skip
        trial_dir=tdir,
        metrics_path=metrics,
        log_path=tdir / "log.txt",
        world_size=r.world_size,
        device=r.device,
        env={**env, OWNER_ENV: owner},
        timeout_s=timeout,
        hang_timeout_s=max(space.budget.hang_timeout_s, timeout / 4),
        spec=spec,
    )
    try:
        runner.submit(launch)
    except TrialLaunchError as e:
        return _failed(steps, f"the run could not be launched: {e}")
    outcome = _wait(runner, launch.trial_id)
    result = outcome.metrics.get("verify") if outcome.status == "ok" else None
    if not isinstance(result, dict):
        why = outcome.reason or "the trial process wrote no verify result"
        return {
            **_failed(
                steps, f"the run failed ({outcome.failure_class or outcome.status}): {why}"
            ),  # fmt: skip
            "log": str(launch.log_path),
        }
    result = dict(result)
    result["params"] = dict(params)
    result["runner"] = space.runner.name
    result["log"] = str(launch.log_path)
    return result


def _wait(runner: BaseRunner, trial_id: int) -> Outcome:
    """Poll ``runner`` until the run ``trial_id`` finishes (the runner enforces its time
    and hang limits); its outcome."""
    while True:
        for f in runner.poll():
            if f.trial_id == trial_id:
                return f.outcome
        time.sleep(POLL_S)


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


def verify_study(
    storage: Storage, study: StudyRecord, steps: int = DEFAULT_STEPS
) -> dict[str, Any]:
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
    runner = make_runner(space)
    owner = str(Owner.new(runner.host))
    workdir = Path(space.runner.workdir) / space.study
    runner.prepare(owner)
    try:
        best = _run_one(space, runner, owner, dict(best_params), steps, workdir, "best", 1)
        baseline = (
            None
            if same
            else _run_one(
                space, runner, owner, dict(base_params), steps, workdir, "baseline", 2
            )  # fmt: skip
        )
    except KeyboardInterrupt:
        runner.stop()
        raise
    finally:
        runner.close()
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
    ranks = result["best"].get("world_size", 1)
    fmt = result["best"].get("checkpoint_format", "torch.save")
    lines.append(
        f"(step time: median of the last 10 steps, {clock} clock; measured, {ranks} "
        f"rank(s) through the study's {result['best'].get('runner', 'local')} runner; "
        f"checkpoint: {fmt})"
    )
    lines.append(f"verdict: {result['verdict']}")
    lines += [f"  - {r}" for r in result.get("reasons", [])]
    return "\n".join(lines)
