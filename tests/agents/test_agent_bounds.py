"""The agents' first proposals on spaces at the documented bounds (dse/bounds.py: one knob of
MAX_DOMAIN_VALUES values, MAX_KNOBS knobs, both at once, MAX_LIST_ITEMS warm-start
configurations): each proposal looks at a bounded number of candidates and comes back (a hang
guard stops the test, rather than timing it), and ``dse start`` on such a space stops on
SIGTERM while it proposes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse import bounds as B
from dse.agents import create_agent
from dse.agents._base import Feedback
from dse.agents._optuna import MAX_MOVES
from tests.conftest import EXAMPLES, small_space

_INT = {"type": "int", "low": 1, "high": B.MAX_DOMAIN_VALUES}

SPACES: dict[str, dict[str, Any]] = {
    "one knob, every value": {"micro_batch_size": _INT},
    "one choice knob, every value": {
        "micro_batch_size": {"values": list(range(1, B.MAX_DOMAIN_VALUES + 1))}
    },
    "every knob, 16 values": {
        f"env.NCCL_X{i}": {"type": "int", "low": 1, "high": 16} for i in range(B.MAX_KNOBS)
    },
    "every knob, every value": {f"env.NCCL_X{i}": _INT for i in range(B.MAX_KNOBS)},
}


@pytest.fixture
def hang_guard() -> Iterator[None]:
    """Fail (not time) a test whose proposals hang: before the bound one knob of 4,096 values
    took over 100 s per proposal, every knob at every value did not answer at all."""

    def fire(_s: int, _f: Any) -> None:
        raise TimeoutError("a proposal hung (hang guard: 240 s for the whole test)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(240)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("agent", ["tpe", "tpe-estimate", "gp", "nsga2", "random", "grid"])
@pytest.mark.parametrize("case", sorted(SPACES))
def test_first_proposals_at_every_bound(
    case: str, agent: str, hang_guard: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if agent in ("gp", "nsga2", "grid") and case.startswith("every knob, every"):
        pytest.skip("as tpe there (one sampler path); kept short on a shared machine")
    name, prior = ("tpe", False) if agent == "tpe-estimate" else (agent, True)
    space = small_space("b", SPACES[case], agent={"name": name, "prior": prior, "seed": 3})
    # the prior's value preferences read a knob's numbers: from a cache, not by a pass over
    # its domain per candidate (16.8 million steps per proposal at one knob of 4,096 values)
    from dse.agents import _prior

    passes: list[int] = []
    numeric = _prior._numeric

    def counted_numeric(values: Any) -> list[float]:
        if getattr(values, "numeric", None) is None:
            passes.append(len(values))
        return numeric(values)

    monkeypatch.setattr(_prior, "_numeric", counted_numeric)
    a = create_agent(space)
    looked: list[int] = []
    cands = getattr(a, "_prior_candidates", None)
    if cands is not None:

        def counted() -> Iterator[dict[str, Any]]:
            looked.append(0)
            for c in cands():
                looked[-1] += 1
                yield c

        a._prior_candidates = counted  # type: ignore[attr-defined]
    seen = set()
    for i in range(4):  # the baseline, then the structured start
        (p,) = a.ask(1)
        key = tuple(sorted(p.params.items()))
        assert key not in seen
        seen.add(key)
        a.tell(p.trial_id, Feedback("complete", values=(100.0 + i,), metrics={"peak_mem_gib": 9}))
    # the candidates of one proposal: two roots' moves within the budget, random configs
    per_root = MAX_MOVES * 8 // max(8, len(space.knobs))
    assert all(n <= max(B.MAX_DOMAIN_VALUES, 2 * per_root + 512) for n in looked), looked
    assert sum(passes) <= sum(len(k.values()) for k in space.knobs.values()), len(passes)


def test_warm_start_at_its_bound(hang_guard: None) -> None:
    ws = [{"micro_batch_size": v} for v in range(1, B.MAX_LIST_ITEMS + 1)]
    space = small_space("b", {"micro_batch_size": _INT}, agent={"name": "tpe", "warm_start": ws})
    a = create_agent(space)
    got = [a.ask(1)[0] for _ in range(3)]
    assert len({p.params["micro_batch_size"] for p in got}) == 3


def test_sigterm_stops_dse_start_while_it_proposes(tmp_path: Path) -> None:
    """``dse start`` of a space at the bounds (simulated trials) stops on SIGTERM: the study
    is left stopped and the process exits with 128 + SIGTERM."""
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    d.update(study="bounds", workload={"name": "sim"}, budget={"n_trials": 500})
    d["knobs"] = {f"env.NCCL_X{i}": dict(_INT) for i in range(B.MAX_KNOBS)}
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "runs")}
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(d))
    url = f"sqlite:///{tmp_path / 'b.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "start", "--space", str(space), "--storage", url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        # wait until the first trial finished: the agent is proposing from then on
        from dse.storage import open_storage

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            st = open_storage(url)
            try:
                done = [t for t in st.list_trials(st.get_study("bounds").id) if t.finished_at]
            except Exception:  # noqa: BLE001 - the study is not created yet
                done = []
            finally:
                st.close()
            if done:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)  # a hang guard, not a timing
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    st = open_storage(url)
    try:
        assert st.get_study("bounds").state == "stopped"
    finally:
        st.close()
