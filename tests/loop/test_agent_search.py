"""The study loop while the agent searches: rejections are stored as they happen, and a
space that is mostly invalid ends with a message instead of a silent spin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dse.agents import BaseAgent, Feedback, Proposal
from dse.loop.study import StudyRunner
from dse.runners import LocalRunner
from dse.space.searchspace import SearchSpace, parse_space
from dse.storage import open_storage
from tests.conftest import EXAMPLES


def _space(tmp_path: Path) -> tuple[SearchSpace, str]:
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    d["knobs"] = {
        "tensor_model_parallel_size": {"values": [1, 2, 4]},
        "micro_batch_size": {"values": [1, 2, 4, 8]},
    }
    d["workload"] = {"name": "sim"}
    d["budget"] = {"n_trials": 2}
    d["runner"] = {"name": "local", "max_parallel": 1, "workdir": str(tmp_path / "r")}
    return parse_space(d), yaml.safe_dump(d)


class Stubborn(BaseAgent):
    """Ignores the rules it is given: proposes TP 4 (invalid on 2 ranks) ``bad`` times, then
    valid configurations; on each ask it notes how many rejections storage holds."""

    name = "stubborn"

    def __init__(self, space: SearchSpace, bad: int, stored: Any) -> None:
        super().__init__(space)
        self.bad = bad
        self.stored = stored
        self.seen_in_storage: list[int] = []
        self.n = 0
        self.good = [{"tensor_model_parallel_size": 1, "micro_batch_size": m} for m in (1, 2)]

    def ask(self, n: int = 1) -> list[Proposal]:
        self.seen_in_storage.append(self.stored())
        self.n += 1
        if self.n <= self.bad:
            mbs = (1, 2, 4, 8)[self.n % 4]
            return [
                Proposal(f"b{self.n}", {"tensor_model_parallel_size": 4, "micro_batch_size": mbs})
            ]
        return [Proposal(f"g{self.n}", self.good.pop(0))] if self.good else []

    def tell(self, trial_id: str, feedback: Feedback) -> None:
        pass

    def add_evaluated(self, params: dict[str, Any], feedback: Feedback) -> None:
        pass


def _run(tmp_path: Path, bad: int) -> tuple[Stubborn, Any, list[str]]:
    space, text = _space(tmp_path)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    st = open_storage(url)
    lines: list[str] = []

    def stored() -> int:
        try:
            return sum(st.count_rejections(st.get_study(space.study).id).values())
        except Exception:  # noqa: BLE001 - the study is created by the run
            return 0

    agent = Stubborn(space, bad, stored)
    runner = LocalRunner(device="cpu", world_size=2, max_parallel=1)
    res = StudyRunner(
        space, storage=st, runner=runner, agent=agent, space_yaml=text, features=set(),
        progress=lines.append,
    ).run()  # fmt: skip
    st.close()
    return agent, res, lines


def test_rejections_are_stored_while_the_agent_is_asked(tmp_path: Path) -> None:
    agent, res, lines = _run(tmp_path, bad=3)
    # the 2nd, 3rd and 4th asks of the same propose call already see 1, 2, 3 stored rejections
    assert agent.seen_in_storage[:4] == [0, 1, 2, 3]
    assert res.rejections == 3 and res.counts["complete"] == 2
    assert sum("rejected before launch (invalid): world_divisible" in ln for ln in lines) == 3


def test_a_mostly_invalid_space_ends_with_a_message(tmp_path: Path) -> None:
    agent, res, lines = _run(tmp_path, bad=10_000)
    assert res.counts["total"] == 0
    msgs = [ln for ln in lines if "proposals in a row were rejected before launch" in ln]
    assert msgs and "most of this space breaks the rules" in msgs[-1]
    assert "stopped asking" in msgs[-1]
    assert agent.n <= 1000  # tens per call, a few calls: not 10,000 per call
