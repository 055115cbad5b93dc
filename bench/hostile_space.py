"""How long validation takes on the hostile space files of the review, now that parsing,
constraints and the space check are bounded (``parse_space_text`` + ``check_space``, what
``dse validate`` and ``POST /studies`` run). CPU time of this process, so that the machine's
other load does not inflate it; each case is refused or accepted, never a traceback.

    python bench/hostile_space.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import yaml

from dse.core.exceptions import SpaceError
from dse.model.rules import check_space
from dse.space.searchspace import parse_space_text

TINY = (Path(__file__).resolve().parents[1] / "examples" / "tiny_gpt_cpu.yaml").read_text()
RUNNER = "runner: {name: local, max_parallel: 1, workdir: dse_runs}\n"


def bomb() -> str:
    lines = ["    a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    for i in range(1, 10):
        lines.append(f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return TINY.replace(RUNNER, "runner:\n  options:\n" + "\n".join(lines) + "\n")


def with_knobs(knobs: dict[str, object], constraints: list[str] | None = None) -> str:
    d = yaml.safe_load(TINY)
    d["knobs"] = knobs
    if constraints:
        d["constraints"] = constraints
    return yaml.safe_dump(d)


INT5 = [
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "micro_batch_size",
]
CASES: dict[str, Callable[[], str]] = {
    "alias chain in runner.options (9^9)": bomb,
    "constraint 7**10**6 > 0": lambda: TINY + 'constraints: ["7**10**6 > 0"]\n',
    "constraint 9**9**9**9 > 0": lambda: TINY + 'constraints: ["9**9**9**9 > 0"]\n',
    "int knob high: 1e12": lambda: TINY.replace(
        "micro_batch_size: {values: [1, 2, 4], baseline: 1}",
        "micro_batch_size: {type: int, low: 1, high: 1000000000000}",
    ),
    "5 collapsing when: knobs of 4,096 values": lambda: with_knobs(
        {
            "recompute": {"values": ["none"]},
            **{
                n: {"type": "int", "low": 1, "high": 4096, "when": {"recompute": "full"}}
                for n in INT5
            },
        }
    ),
    "5 int knobs of 64 values (1e9 configurations)": lambda: with_knobs(
        {
            "recompute": {"values": ["none"]},
            **{n: {"type": "int", "low": 1, "high": 64} for n in INT5},
        }
    ),
    "64 constraints of 40 terms each": lambda: with_knobs(
        yaml.safe_load(TINY)["knobs"],
        [" + ".join(["dp"] * 40) + f" > {i}" for i in range(64)],
    ),
}


def main() -> None:
    print(f"{'case':48} {'cpu s':>7}  result")
    for name, make in CASES.items():
        text = make()
        t0 = time.process_time()
        try:
            got = check_space(parse_space_text(text, "x"), "x")
            result = f"accepted: {got.looked_at} configurations looked at, {got.valid} valid"
        except SpaceError as e:
            result = "refused: " + str(e).splitlines()[0][3:90]
        print(f"{name:48} {time.process_time() - t0:7.2f}  {result}")


if __name__ == "__main__":
    main()
