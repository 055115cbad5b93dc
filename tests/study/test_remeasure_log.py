"""The study log says that it re-measures tied configurations before the re-measure trials
say they started (issue 29: "trial 10 started" came before the line announcing it)."""

from __future__ import annotations

from pathlib import Path

import yaml

from dse.agents import create_agent
from dse.storage import open_storage
from dse.study import StudyRunner
from dse.workloads.replay import ReplayTable
from dse.workloads.runners import InProcessRunner
from tests.study.test_loss_parity_replay import _noise_table, _space


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
