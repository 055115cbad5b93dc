"""Crash-and-resume check: a study's controller is SIGKILLed at random moments and resumed.

Runs a study on the replay workload (each trial a real subprocess that takes ``--delay``
seconds), kills the controller process with SIGKILL ``--kills`` times at random moments,
resumes it with ``dse resume`` each time, then lets it finish. Prints one JSON object:
trials at the end, completed trials lost, trials duplicated, numbers, and whether the final
count equals the budget. Exit code 0 when nothing was lost or duplicated.

    python bench/crash_resume.py --storage sqlite:///crash.db --kills 20 --budget 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "examples" / "tables" / "h200_llama1b_unfused_1gpu.jsonl"


def make_space(workdir: Path, budget: int, delay: float, study: str) -> Path:
    space = yaml.safe_load((REPO / "examples" / "replay_llama1b.yaml").read_text())
    space["study"] = study
    space["workload"] = {"name": "replay", "table": str(TABLE), "delay_s": delay}
    # no re-measures on top of the budget: the count at the end is the budget
    space["budget"] = {"n_trials": budget, "trial_timeout_s": 60, "hang_timeout_s": 30,
                       "remeasure": 0}  # fmt: skip
    space["runner"] = {"name": "local", "max_parallel": 2, "workdir": str(workdir / "runs")}
    space["agent"] = {"name": "random", "seed": 7}
    # every trial runs (no pre-screen), so the count at the end is exactly the budget
    space["prescreen"] = {"enabled": False}
    # fit the budget: a bigger space of the table's values (missing rows are 'invalid' at
    # run time, which still counts as a trial of the budget)
    space["knobs"]["micro_batch_size"] = {"values": [1, 2, 4, 8], "baseline": 1}
    p = workdir / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    return p


def snapshot(url: str, study: str) -> dict[int, dict]:
    from dse.storage import open_storage

    st = open_storage(url)
    try:
        rec = st.get_study(study)
        return {
            t.number: {
                "state": t.state,
                "key": t.params_key,
                # the measured metrics; the loss-parity verdict ("numerics") is the
                # controller's judgement, revised when the baseline finishes after a trial
                "metrics": {k: v for k, v in t.metrics.items() if k != "numerics"},
                "attempts": t.attempts,
                "remeasure_of": t.remeasure_of,
            }
            for t in st.list_trials(rec.id)
        }
    except Exception:  # the study may not exist before the first controller wrote it
        return {}
    finally:
        st.close()


def _study_exists(url: str, study: str) -> bool:
    from dse.exceptions import StudyNotFoundError
    from dse.storage import open_storage

    st = open_storage(url)
    try:
        st.get_study(study)
        return True
    except StudyNotFoundError:
        return False
    finally:
        st.close()


def run(url: str, kills: int, budget: int, delay: float, seed: int) -> dict:
    rng = random.Random(seed)
    study = f"crash-{os.getpid()}-{int(time.time())}"
    work = Path(tempfile.mkdtemp(prefix="dse-crash-"))
    space = make_space(work, budget, delay, study)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "dse.cli"]
    completed_seen: dict[int, dict] = {}
    lost: list[int] = []
    changed: list[int] = []
    kill_times: list[float] = []
    for i in range(kills + 1):
        if i == 0 or not snapshot(url, study) and not _study_exists(url, study):
            # before the first controller got as far as creating the study: start again
            cmd = [*base, "start", "--space", str(space), "--storage", url]
        else:
            cmd = [*base, "resume", "--study", study, "--storage", url]
        log = open(work / f"controller-{i}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
        if i < kills:
            wait = rng.uniform(0.5, 4.0)
            kill_times.append(round(wait, 2))
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        else:
            proc.wait(timeout=600)
        log.close()
        snap = snapshot(url, study)
        for n, t in completed_seen.items():
            now = snap.get(n)
            if now is None or now["state"] != t["state"]:
                lost.append(n)
            elif now["metrics"] != t["metrics"] or now["key"] != t["key"]:
                changed.append(n)
        for n, t in snap.items():
            if t["state"] in ("complete", "infeasible", "failed") and n not in completed_seen:
                completed_seen[n] = t
    final = snapshot(url, study)
    # a re-measurement runs a configuration again on purpose (remeasure_of): not a duplicate
    keys = [t["key"] for t in final.values() if t["remeasure_of"] is None]
    numbers = sorted(final)
    states: dict[str, int] = {}
    for t in final.values():
        states[t["state"]] = states.get(t["state"], 0) + 1
    return {
        "storage": url.split("://")[0],
        "kills": kills,
        "kill_after_s": kill_times,
        "budget": budget,
        "final_trials": len(final),
        "states": states,
        "numbers_contiguous": numbers == list(range(len(final))),
        "interrupted_and_rerun": sum(t["attempts"] for t in final.values()),
        "completed_lost": len(set(lost)),
        "completed_changed": len(set(changed)),
        "duplicated_configs": len(keys) - len(set(keys)),
        "count_equals_budget": len(final) == budget,
        "controller_exit": proc.returncode,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", default="sqlite:///crash_resume.db")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--delay", type=float, default=0.5, help="seconds a replay trial takes")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    res = run(a.storage, a.kills, a.budget, a.delay, a.seed)
    print(json.dumps(res))
    ok = (
        res["completed_lost"] == 0
        and res["completed_changed"] == 0
        and res["duplicated_configs"] == 0
        and res["count_equals_budget"]
        and res["numbers_contiguous"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
