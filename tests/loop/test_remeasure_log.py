"""The study log says that it re-measures tied configurations before the re-measure trials
say they started (issue 29: "trial 10 started" came before the line announcing it)."""

from __future__ import annotations

from pathlib import Path

import yaml

from dse.agents import create_agent
from dse.loop.study import StudyRunner
from dse.runners import InProcessRunner
from dse.storage import open_storage
from dse.workloads.replay import ReplayTable
from tests.loop.test_loss_parity_replay import _noise_table, _space


def test_the_remeasure_line_comes_before_the_trials_it_launches(tmp_path: Path) -> None:
    space = _space(_noise_table(tmp_path), "noisy", tmp_path, budget={"remeasure": 2})
    table = ReplayTable.load(space.workload.table)
    lines: list[str] = []
    with open_storage(f"sqlite:///{tmp_path / 'noisy.db'}") as st:
        loop = StudyRunner(
            space, storage=st, agent=create_agent(space), features=None,
            runner=InProcessRunner(
                lambda s: table.outcome(s.params, s.workload.get("repeat", 0)), slots=2),
            space_yaml=yaml.safe_dump(space.model_dump(mode="json")), progress=lines.append,
        )  # fmt: skip
        loop.run()
    announce = next(i for i, x in enumerate(lines) if "re-measuring" in x)
    remeasured = [i for i, x in enumerate(lines) if "re-measures trial" in x]
    started = [i for i, x in enumerate(lines) if " started:" in x]
    assert remeasured, lines  # the study did re-measure
    # every trial started after the announcement is a re-measure; none before it is
    assert len([i for i in started if i > announce]) == 2, lines
    assert lines[announce + 1].startswith("trial ") and " started:" in lines[announce + 1]


def _tie_table(tmp_path: Path) -> Path:
    """Four configurations within noise of each other (whichever two run first tie, and so
    does the best of the four); each row twice (its re-measure)."""
    import json

    from tests.conftest import REPLAY_TABLE

    rows = [json.loads(x) for x in REPLAY_TABLE.read_text().splitlines() if x.strip()]
    first = next(r for r in rows if r["status"] == "ok")
    times = [2.0, 1.5, 1.0, 1.02, 0.98, 1.0]

    def row(mbs: int, tflops: float) -> dict:
        r = json.loads(json.dumps(first))
        r["params"] = {**r["params"], "micro_batch_size": mbs}
        r["metrics"]["tflops_per_gpu"] = tflops
        r["metrics"]["step_times_s"] = [t * r["metrics"]["step_time_s"] for t in times]
        return r

    table = [row(1, 100.0), row(2, 100.5), row(4, 100.3), row(8, 100.6)]
    table += [row(1, 100.2), row(2, 100.3), row(4, 100.1), row(8, 100.2)]
    path = tmp_path / "ties.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in table))
    return path


def test_a_grown_budget_re_measures_the_new_tie(tmp_path: Path) -> None:
    """The first run spends its re-measure on the tie of its two configurations; given two
    more trials, the tie of the new best is re-measured too, not named from one run."""
    table_path = _tie_table(tmp_path)
    table = ReplayTable.load(table_path)

    def run(n_trials: int) -> list:
        space = _space(table_path, "grow", tmp_path, budget={"n_trials": n_trials, "remeasure": 1})
        with open_storage(f"sqlite:///{tmp_path / 'grow.db'}") as st:
            StudyRunner(
                space, storage=st, agent=create_agent(space), features=None,
                runner=InProcessRunner(
                    lambda s: table.outcome(s.params, s.workload.get("repeat", 0)), slots=1),
                space_yaml=yaml.safe_dump(space.model_dump(mode="json")), progress=lambda m: None,
            ).run()  # fmt: skip
            return st.list_trials(st.get_study("grow").id)

    first = run(2)
    again = [t for t in first if t.remeasure_of is not None]
    assert len(first) == 3 and len(again) == 1
    grown = run(4)
    new = [t for t in grown if t.remeasure_of is not None and t.number > first[-1].number]
    assert len(grown) == 6 and len(new) == 1
