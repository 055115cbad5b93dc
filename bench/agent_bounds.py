"""Seconds per proposal of an agent on a space at the documented bounds (dse/core/bounds.py).

In process (the default): cases ``one4096`` (one knob of MAX_DOMAIN_VALUES values),
``k256x16`` (MAX_KNOBS knobs of 16 values), ``k256x4096`` (both bounds at once). Asks 4
proposals (the baseline, then the structured start), telling each a made-up measurement, and
prints one JSON line with the seconds of each ask.

    python bench/agent_bounds.py --case one4096 --agent tpe [--no-prior]

End to end (``--end-to-end``): what a user sees. For a space at each documented bound (every
case of :data:`E2E_CASES`, or ``--case``), written as a space file, the seconds from launching
``dse start --space S --dry-run 2`` until it has printed its two trials (the baseline and the
agent's first own proposal), and from launching ``dse start --space S --workload sim
--n-trials 2`` until it has printed trial 1's result (the baseline run, the agent's first own
proposal, its simulated run), ``--repeats`` times each; one JSON line per case.

    python bench/agent_bounds.py --end-to-end [--case all] [--repeats 3]

Validation (``--validate``): the CPU seconds (user + system) and wall seconds of ``dse
validate`` on each end-to-end case's space file, one JSON line per case with its exit code
(and the last line of its error output when it failed).

    python bench/agent_bounds.py --validate [--case all]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from dse.agents import create_agent  # noqa: E402
from dse.agents._base import Feedback  # noqa: E402
from dse.core import bounds as B  # noqa: E402
from dse.space.searchspace import parse_space  # noqa: E402

MODEL = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_query_groups": 8,
         "ffn_hidden_size": 1024, "vocab_size": 1024}  # fmt: skip

#: The end-to-end cases: each puts one documented bound (or all of them) at its maximum.
E2E_CASES = {
    "one4096": "one int knob of MAX_DOMAIN_VALUES (4,096) values",
    "choice4096": "one choice knob of 4,096 listed values",
    "k256x16": "MAX_KNOBS (256) knobs of 16 values",
    "k256x4096": "256 knobs of 4,096 values",
    "fixed256": "256 knobs of 16 values and 256 fixed knobs",
    "constraints": "MAX_CONSTRAINTS (64) constraints of MAX_CONSTRAINT_NODES (200) nodes, "
    "256-bit integers and exponents up to 255, on 4 parallelism and batch knobs (8 GPUs)",
    "constraints_reject": "64 constraints of up to 200 nodes, the last one rejecting "
    "what the prior prefers, on 17 knobs of 49,152 configurations (every one a candidate)",
    "warm1024": "MAX_LIST_ITEMS (1,024) warm-start configurations",
    "all": "all at once: 256 knobs, 252 of 2,250 to 4,096 values (12 of them listed), "
    "256 fixed, 64 constraints of 200 nodes on the other 4, every derivation, a file of "
    "~1 MiB and ~50,000 YAML nodes",
}


def knobs(case: str) -> dict[str, dict[str, object]]:
    full = {"type": "int", "low": 1, "high": B.MAX_DOMAIN_VALUES}
    if case == "one4096":
        return {"micro_batch_size": full}
    n = B.MAX_KNOBS
    high = 16 if case == "k256x16" else B.MAX_DOMAIN_VALUES
    return {f"env.NCCL_X{i}": {"type": "int", "low": 1, "high": high} for i in range(n)}


def in_process(case: str, agent_name: str, prior: bool) -> int:
    space = parse_space({
        "study": "bounds", "model": MODEL,
        "semantics": {"global_batch_size": 8, "seq_length": 128},
        "resources": {"world_size": 1, "gpu_memory_gib": 80.0, "features": []},
        "knobs": knobs(case),
        "agent": {"name": agent_name, "prior": prior, "seed": 1},
    })  # fmt: skip
    agent = create_agent(space)
    took = []
    for i in range(4):
        t = time.perf_counter()
        props = agent.ask(1)
        took.append(round(time.perf_counter() - t, 3))
        for p in props:
            agent.tell(p.trial_id, Feedback("complete", values=(100.0 + i,),
                                            metrics={"peak_mem_gib": 10.0}))  # fmt: skip
    print(json.dumps({"case": case, "agent": agent_name, "prior": prior,
                      "seconds_per_ask": took}))  # fmt: skip
    return 0


# --- spaces at the bounds, as files ---------------------------------------------------------
_CONSTRAINT_KNOBS = ("micro_batch_size", "tensor_model_parallel_size",
                     "pipeline_model_parallel_size", "context_parallel_size")  # fmt: skip
#: Those knobs with domains of mostly valid values on 8 GPUs (a knob of 4,096 values of TP
#: at 8 GPUs is 4,092 invalid ones: the sampler's draws would be rejected one by one).
PARALLEL = {n: {"values": [1, 2, 4, 8]} for n in _CONSTRAINT_KNOBS}


REJECT_BOOLS = ("bias_activation_fusion", "bias_dropout_fusion", "cross_entropy_loss_fusion",
                "use_distributed_optimizer", "grad_reduce_in_fp32", "masked_softmax_fusion",
                "gradient_accumulation_fusion", "apply_rope_fusion", "store_param_remainders",
                "overlap_grad_reduce")  # fmt: skip


def _nodes(expr: str) -> int:
    return sum(1 for _ in ast.walk(ast.parse(expr, mode="eval")))


def constraint(i: int) -> str:
    """A constraint of exactly MAX_CONSTRAINT_NODES nodes (at most MAX_CONSTRAINT_CHARS
    characters), true on every configuration of :func:`e2e_space`, computing with integers
    near MAX_INT_BITS bits and an exponent near MAX_EXPONENT."""
    k = _CONSTRAINT_KNOBS
    expr = f"{k[0]} * 2 ** 240 + {k[1]} * dp < 2 ** 255 + {i}"
    j = 0
    while True:
        name = k[j % len(k)]
        more = f"{expr} and {name} * {j + 3} >= {j % 2} - world_size"
        if _nodes(more) > B.MAX_CONSTRAINT_NODES or len(more) > B.MAX_CONSTRAINT_CHARS:
            break
        expr, j = more, j + 1
    while True:  # up to the bound: `not (not (...))` adds 4 nodes
        more = f"not (not ({expr}))"
        if _nodes(more) > B.MAX_CONSTRAINT_NODES or len(more) > B.MAX_CONSTRAINT_CHARS:
            break
        expr = more
    return expr


def e2e_space(case: str) -> tuple[dict[str, Any], str]:
    """(the space, text appended to its file) of an end-to-end case: the tiny CPU example on
    simulated trials, with its knobs and sections at a bound."""
    d = yaml.safe_load((ROOT / "examples" / "tiny_gpt_cpu.yaml").read_text())
    d.update(study=f"bounds-{case}", workload={"name": "sim"}, budget={"n_trials": 2})
    d["resources"] = {"world_size": 1, "device": "cpu", "features": []}
    d["agent"] = {"name": "tpe", "seed": 1}
    full = {"type": "int", "low": 1, "high": B.MAX_DOMAIN_VALUES}
    listed = {"values": list(range(1, B.MAX_DOMAIN_VALUES + 1))}
    pad = ""

    def env(n: int, high: int, start: int = 0) -> dict[str, Any]:
        return {f"env.NCCL_X{i}": {"type": "int", "low": 1, "high": high}
                for i in range(start, start + n)}  # fmt: skip

    if case == "one4096":
        d["knobs"] = {"micro_batch_size": full}
    elif case == "choice4096":
        d["knobs"] = {"micro_batch_size": listed}
    elif case in ("k256x16", "k256x4096"):
        d["knobs"] = env(B.MAX_KNOBS, 16 if case == "k256x16" else B.MAX_DOMAIN_VALUES)
    elif case == "fixed256":
        d["knobs"] = env(B.MAX_KNOBS, 16)
        d["fixed"] = {f"env.NCCL_F{i}": i for i in range(B.MAX_KNOBS)}
    elif case == "constraints":
        d["resources"]["world_size"] = 8
        d["knobs"] = dict(PARALLEL)
        d["constraints"] = [constraint(i) for i in range(B.MAX_CONSTRAINTS)]
    elif case == "constraints_reject":
        # valid only with the least preferred micro-batch size and recompute: the start's
        # favourites all break the last constraint, after 63 constraints that hold
        d["resources"]["features"] = ["transformer_engine", "apex"]
        d["knobs"] = {
            "micro_batch_size": {"values": [1, 2, 4, 8]},
            **{n: {"values": [1]} for n in _CONSTRAINT_KNOBS[1:]},
            "recompute": {"values": ["none", "selective", "full"], "baseline": "full"},
            "attention_backend": {"values": ["unfused", "sdpa"]},
            "main_grads_dtype": {"values": ["fp32", "bf16"]},
            **{n: {"type": "bool"} for n in REJECT_BOOLS},
        }
        d["constraints"] = [constraint(i) for i in range(B.MAX_CONSTRAINTS - 1)]
        d["constraints"].append("micro_batch_size == 1 and recompute == 'full'")
    elif case == "warm1024":
        d["knobs"] = {"micro_batch_size": full}
        d["agent"]["warm_start"] = [{"micro_batch_size": v}
                                    for v in range(2, B.MAX_LIST_ITEMS + 2)]  # fmt: skip
    elif case == "all":
        d["resources"]["world_size"] = 8
        named = dict(PARALLEL)  # the knobs the constraints read
        # 11 knobs of 4,096 listed values and one of the values the YAML node bound leaves
        lists = {f"env.NCCL_L{i}": dict(listed) for i in range(11)}
        lists["env.NCCL_L11"] = {"values": list(range(1, 2251))}
        rest = B.MAX_KNOBS - len(named) - len(lists)
        d["knobs"] = {**named, **lists, **env(rest, B.MAX_DOMAIN_VALUES)}
        d["fixed"] = {f"env.NCCL_F{i}": i for i in range(B.MAX_KNOBS)}
        d["constraints"] = [constraint(i) for i in range(B.MAX_CONSTRAINTS)]
        d["derived"] = {"sequence_parallel": "bridge", "tp_comm_overlap": "bridge",
                        "overlap_grad_reduce": "bridge", "overlap_param_gather": "bridge",
                        "expert_tensor_parallel_size": "bridge"}  # fmt: skip
        body = yaml.safe_dump(d, sort_keys=False, width=1 << 20)
        room = B.MAX_SPACE_BYTES - len(body.encode()) - 1024
        line = "# " + "x" * 1021 + "\n"  # 1 KiB comment lines up to the file bound
        pad = line * max(0, room // len(line))
    else:
        raise ValueError(case)
    return d, pad


def write_space(case: str, folder: Path) -> Path:
    d, pad = e2e_space(case)
    d["runner"] = {"name": "local", "workdir": str(folder / "runs")}
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False, width=1 << 20) + pad)
    return path


def _timed(argv: list[str], until: str, stream: str, timeout: float) -> tuple[float, int]:
    """Seconds from launching ``argv`` until ``stream`` (stdout/stderr) has a line starting
    with ``until`` (or the process exits), and its exit status (None: still running)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
        stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    out = proc.stdout if stream == "stdout" else proc.stderr
    assert out is not None
    took = None
    try:
        for line in out:
            if line.startswith(until):
                took = time.perf_counter() - t0
                break
            if time.perf_counter() - t0 > timeout:
                break
        rc = proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if took is None:
        raise RuntimeError(f"{' '.join(argv[:6])}: no line {until!r} (exit {rc})")
    return round(took, 2), rc if rc is not None else -9


def end_to_end(case: str, repeats: int, timeout: float) -> dict[str, Any]:
    dry: list[float] = []
    real: list[float] = []
    size = 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="dse-bounds-") as tmp:
            folder = Path(tmp)
            space = write_space(case, folder)
            size = space.stat().st_size
            cli = [sys.executable, "-m", "dse.cli", "start", "--space", str(space)]
            took, rc = _timed([*cli, "--dry-run", "2"], "## trial 1:", "stdout", timeout)
            assert rc == 0, (case, rc)
            dry.append(took)
            url = f"sqlite:///{folder / 'b.db'}"
            took, rc = _timed([*cli, "--workload", "sim", "--n-trials", "2", "--storage", url],
                              "trial 1 ", "stderr", timeout)  # fmt: skip
            assert rc == 0, (case, rc)
            real.append(took)
    return {"case": case, "file_bytes": size, "dry_run_2_s": dry, "sim_trial_1_s": real}


def validate(case: str, timeout: float) -> dict[str, Any]:
    """``dse validate`` of the case's space file: CPU and wall seconds, exit code."""
    import resource

    with tempfile.TemporaryDirectory() as tmp:
        path = write_space(case, Path(tmp))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "dse.cli", "validate", str(path)],
            capture_output=True, text=True, timeout=timeout, cwd=tmp,
        )  # fmt: skip
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out: dict[str, Any] = {"case": case, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
                           "exit": proc.returncode}  # fmt: skip
    if proc.returncode != 0:
        out["error"] = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(E2E_CASES))
    ap.add_argument("--agent", default="tpe")
    ap.add_argument("--no-prior", action="store_true", help="agent.prior: false")
    ap.add_argument("--end-to-end", action="store_true", help="time dse start as a user runs it")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per command")
    ap.add_argument("--validate", action="store_true", help="time dse validate of each case")
    a = ap.parse_args()
    if a.validate:
        print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}: {os.cpu_count()} cores, load "
              f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)  # fmt: skip
        for case in [a.case] if a.case else list(E2E_CASES):
            print(json.dumps({**validate(case, a.timeout), "what": E2E_CASES[case]}), flush=True)
        print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    if not a.end_to_end:
        case = a.case or "one4096"
        if case not in ("one4096", "k256x16", "k256x4096"):
            ap.error("in process: --case one4096, k256x16 or k256x4096")
        return in_process(case, a.agent, not a.no_prior)
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {os.uname().nodename}: "
          f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
          f", python {sys.version.split()[0]}", flush=True)  # fmt: skip
    for case in [a.case] if a.case else list(E2E_CASES):
        print(json.dumps({**end_to_end(case, a.repeats, a.timeout), "what": E2E_CASES[case]}),
              flush=True)  # fmt: skip
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
