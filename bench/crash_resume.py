"""Crash-and-resume check: a study's controller is SIGKILLed at chosen points and resumed.

Runs a study on the replay workload (each trial a real subprocess that takes ``--delay``
seconds), kills the controller process with SIGKILL ``--kills`` times, resumes it with
``dse resume`` each time, then lets it finish. Each kill aims at a point of the controller's
work, in turn from ``--points`` (``random``: a random moment, as earlier versions did):

- ``trial_running``: a trial is running (its row ``running``, its metrics without a final
  line): the resumed controller must re-queue and re-run it;
- ``result_written``: a trial has written its final line but the controller has not recorded
  it (the row still ``running``): the resumed controller must take that result, not re-run;
- ``claim_in_flight``: a trial was claimed (row ``queued`` with this controller as owner) but
  not started.

The bench watches the database and the trial folders every few milliseconds and kills when
the point is reached (up to 30 s, else at that moment); what the kill actually hit is read
after it from the frozen database and the metrics files (a kill may hit several points, or
land before the study exists: ``before_start``, also given as ``kills_before_start``).
Prints one JSON object: kills aimed and hit per point, trials re-queued and re-run, the
trials caught at ``result_written`` and those of them not recorded from their metrics file
(re-run, or stored with other metrics), trials at the end, completed trials lost, trials
duplicated, numbers, and whether the final count equals the budget. Exit code 0 when nothing
was lost, duplicated or re-run after its result was written.

    python bench/crash_resume.py --storage sqlite:///crash.db --kills 21 --budget 30
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
    from dse.core.exceptions import StudyNotFoundError
    from dse.storage import open_storage

    st = open_storage(url)
    try:
        st.get_study(study)
        return True
    except StudyNotFoundError:
        return False
    finally:
        st.close()


POINTS = ("trial_running", "result_written", "claim_in_flight")


def _final_line(path: str | None) -> bool:
    """Whether a trial's metrics file holds its final line (a summary or a failure)."""
    if not path:
        return False
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return False
    for ln in lines:
        try:
            kind = json.loads(ln).get("type")
        except (ValueError, AttributeError):
            continue
        if kind in ("summary", "failure"):
            return True
    return False


def points_now(url: str, study: str) -> set[str]:
    """The points of :data:`POINTS` the study is at now (empty before it exists)."""
    from dse.storage import open_storage

    st = open_storage(url)
    try:
        rec = st.get_study(study)
        trials = st.list_trials(rec.id)
    except Exception:  # noqa: BLE001 - not created yet
        return {"before_start"}
    finally:
        st.close()
    out: set[str] = set()
    for t in trials:
        if t.state == "running":
            out.add("result_written" if _final_line(t.metrics_path) else "trial_running")
        elif t.state == "queued" and t.runner:
            out.add("claim_in_flight")
    return out


def written_now(url: str, study: str) -> dict[int, dict]:
    """The trials at ``result_written`` now: number -> their metrics file, its text and the
    row's attempts (what the resumed controller must record as it is, without a re-run)."""
    from dse.storage import open_storage

    st = open_storage(url)
    try:
        trials = st.list_trials(st.get_study(study).id, state="running")
    except Exception:  # noqa: BLE001 - not created yet
        return {}
    finally:
        st.close()
    out: dict[int, dict] = {}
    for t in trials:
        if t.metrics_path and _final_line(t.metrics_path):
            text = Path(t.metrics_path).read_text()
            out[t.number] = {"path": t.metrics_path, "text": text, "attempts": t.attempts}
    return out


def _written_outcome(written: dict[int, dict], final: dict[int, dict]) -> list[int]:
    """The trials of ``written`` (caught at ``result_written``) that were not recorded from
    their file: re-queued or re-run (attempts grew, the file was rewritten), not finished, or
    stored with other metrics than the file's final line."""
    from dse.core.records import read_metrics

    bad: list[int] = []
    for n, w in written.items():
        t = final.get(n)
        try:
            same_file = Path(w["path"]).read_text() == w["text"]
        except OSError:
            same_file = False
        out = read_metrics(w["path"]) if same_file else None
        want = None if out is None else {k: v for k, v in out.metrics.items() if k != "numerics"}
        if (
            t is None or not same_file or t["attempts"] != w["attempts"]
            or t["state"] not in ("complete", "infeasible", "failed")
            or json.loads(json.dumps(want)) != json.loads(json.dumps(t["metrics"]))
        ):  # fmt: skip
            bad.append(n)
    return sorted(bad)


def _kill_at(proc: subprocess.Popen, url: str, study: str, point: str, rng: random.Random,
             limit_s: float = 30.0) -> None:  # fmt: skip
    """SIGKILL ``proc`` when the study reaches ``point`` (``random``: after a random wait)."""
    if point == "random":
        wait = rng.uniform(0.5, 4.0)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
    else:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and proc.poll() is None:
            if point in points_now(url, study):
                break
            time.sleep(0.005)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def run(
    url: str, kills: int, budget: int, delay: float, seed: int,
    points: tuple[str, ...] = POINTS,
) -> dict:  # fmt: skip
    rng = random.Random(seed)
    study = f"crash-{os.getpid()}-{int(time.time())}"
    work = Path(tempfile.mkdtemp(prefix="dse-crash-"))
    space = make_space(work, budget, delay, study)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "dse.cli"]
    completed_seen: dict[int, dict] = {}
    lost: list[int] = []
    changed: list[int] = []
    aimed = dict.fromkeys(points, 0)
    hit: dict[str, int] = {}
    written: dict[int, dict] = {}
    for i in range(kills + 1):
        if i == 0 or not snapshot(url, study) and not _study_exists(url, study):
            # before the first controller got as far as creating the study: start again
            cmd = [*base, "start", "--space", str(space), "--storage", url]
        else:
            cmd = [*base, "resume", "--study", study, "--storage", url]
        log = open(work / f"controller-{i}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
        if i < kills:
            point = points[i % len(points)]
            aimed[point] += 1
            _kill_at(proc, url, study, point, rng)
            # what the kill hit: the database is as the dead controller left it
            now = points_now(url, study) or {"between_trials"}
            for p in now:
                hit[p] = hit.get(p, 0) + 1
            if "result_written" in now:  # what the resumed controller must take as it is
                for n, w in written_now(url, study).items():
                    written.setdefault(n, w)
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
        "kills_aimed": aimed,
        "kills_hit": hit,
        # kills that landed before the controller had created the study (hit nothing)
        "kills_before_start": hit.get("before_start", 0),
        # trials a kill caught at result_written, and those of them not recorded from their
        # file (re-run, or stored with other metrics): must be none
        "result_written_trials": len(written),
        "result_written_not_from_file": _written_outcome(written, final),
        "requeued_trials": sum(1 for t in final.values() if t["attempts"]),
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
    ap.add_argument(
        "--points", default=",".join(POINTS),
        help=f"where the kills aim, in turn: {', '.join(POINTS)}, random",
    )  # fmt: skip
    a = ap.parse_args()
    points = tuple(p for p in a.points.split(",") if p)
    bad = [p for p in points if p not in (*POINTS, "random")]
    if bad or not points:
        ap.error(f"--points: {bad or 'none'}; choose from {', '.join(POINTS)}, random")
    res = run(a.storage, a.kills, a.budget, a.delay, a.seed, points)
    print(json.dumps(res))
    ok = (
        res["completed_lost"] == 0
        and not res["result_written_not_from_file"]
        and res["completed_changed"] == 0
        and res["duplicated_configs"] == 0
        and res["count_equals_budget"]
        and res["numbers_contiguous"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
