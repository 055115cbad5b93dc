"""Upstream Megatron-LM's pretrain_gpt.py as dse trials, next to the built-in trainer.

Runs a grid of configurations (``--set knob=v1,v2``; every other knob at its baseline) as two
studies through ``dse start`` (the local runner, the product's own path): the space's
``megatron_lm`` launcher running upstream ``pretrain_gpt.py`` from ``--mlm`` (extracted by
``bench/mlm_extract.sh``) with the resolved-configuration check on, and the same space as the
built-in workload (``workload: megatron``). ``--rounds`` alternates the two. Per trial it
records dse's step time, TFLOP/s (model FLOPs over the measured step time) and peak memory
next to the recipe's own logged figures, and writes report.json and report.txt into OUT:

    python bench/upstream_mlm.py --cpu --out OUT                       # CPU rehearsal
    python bench/upstream_mlm.py --space examples/llama_1b_h200_megatron_lm_upstream.yaml \\
        --set micro_batch_size=1,2 --set recompute=none,full \\
        --set cross_entropy_loss_fusion=false,true --rounds 2 --out OUT    # GPU node

A second call on the same OUT adds the next round (rows.json and rounds.json keep the earlier
ones), so repeats can be separate commands.

``--cpu``: examples/tiny_gpt_cpu_megatron_lm_upstream.yaml with bench/mlm_cpu_shim on the
trial ranks' PYTHONPATH (Megatron-LM's loop needs CUDA; the shim maps it to the CPU for the
rehearsal only) and torch.compile off; ``--extra-site DIR`` adds a folder of packages the
recipe needs that this environment lacks (triton for megatron/training's imports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CPU_SPACE = ROOT / "examples" / "tiny_gpt_cpu_megatron_lm_upstream.yaml"
CPU_SETS = ["micro_batch_size=1,2", "recompute=none,full", "cross_entropy_loss_fusion=false,true"]
KINDS = ("upstream", "builtin")


def _value(text: str) -> Any:
    return yaml.safe_load(text)


def _variant(
    data: dict[str, Any], out: Path, kind: str, tag: str, sets: dict[str, list], mlm: Path
) -> Path:
    data = json.loads(json.dumps(data))
    fixed = dict(data.get("fixed") or {})
    knobs = {}
    for k, spec in data["knobs"].items():
        if k in sets:
            knobs[k] = {"values": sets[k], "baseline": sets[k][0]}
        else:
            fixed[k] = spec.get("baseline", (spec.get("values") or [None])[0])
    for k, vals in sets.items():
        if k not in knobs:
            knobs[k] = {"values": vals, "baseline": vals[0]}
            fixed.pop(k, None)
    data["knobs"], data["fixed"] = knobs, fixed
    data["study"] = f"{data['study']}-{kind}-{tag}"
    data["agent"] = {"name": "grid", "seed": 0}
    n = 1
    for v in sets.values():
        n *= len(v)
    data["budget"]["n_trials"] = n
    data["budget"]["remeasure"] = 0  # the grid once: rounds repeat it
    data["prescreen"] = {"enabled": False}
    data["runner"]["workdir"] = str(out / "runs")
    if kind == "upstream":
        data["workload"]["launcher"]["script"] = str(mlm / "pretrain_gpt.py")
    else:
        data["workload"] = {"name": "megatron"}
    p = out / f"{data['study']}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _results(db: str, study: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "dse.cli", "status", "--storage", db, "--study", study,
         "--format", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return list(json.loads(out)["trials"])


def _row(t: dict[str, Any]) -> dict[str, Any]:
    m = t.get("metrics") or {}
    keys = ("step_time_s", "step_time_s_log", "tflops_per_gpu", "tflops_per_gpu_log",
            "tflops_log_source", "peak_mem_gib", "peak_reserved_gib", "loss",
            "resolved_check", "tflops_source")  # fmt: skip
    row = {k: m.get(k) for k in keys}
    row["state"] = t["state"]
    if t["state"] != "complete":
        row["failure_class"] = t.get("failure_class")
        row["reason"] = (t.get("failure_reason") or t.get("reason") or m.get("reason") or "")[:600]
    return row


def _fmt(x: Any, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, int | float) else str(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", help="the megatron_lm space (default with --cpu: the tiny one)")
    ap.add_argument("--cpu", action="store_true", help="CPU rehearsal (tiny model, gloo)")
    ap.add_argument("--set", action="append", default=[], help="knob=v1,v2 (the grid)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", choices=KINDS, help="run one of the two studies")
    ap.add_argument("--mlm", default=str(ROOT / ".mlm"), help="the extracted Megatron-LM")
    ap.add_argument("--extra-site", action="append", default=[], help="more PYTHONPATH (CPU)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    mlm = Path(args.mlm).resolve()
    if not (mlm / "pretrain_gpt.py").is_file():
        sys.stderr.write(f"{mlm}/pretrain_gpt.py not found: run bench/mlm_extract.sh first\n")
        return 2
    space = Path(args.space) if args.space else CPU_SPACE if args.cpu else None
    if space is None:
        sys.stderr.write("--space is needed without --cpu\n")
        return 2
    data = yaml.safe_load(space.read_text())
    set_args = args.set or (CPU_SETS if args.cpu else [])
    sets = {k: [_value(x) for x in v.split(",")] for k, v in (s.split("=", 1) for s in set_args)}
    db = f"sqlite:///{out}/bench.db"
    env = dict(os.environ)
    if args.cpu:
        # the shim patches megatron.legacy at interpreter start, before the script's folder
        # is on sys.path: the extracted Megatron-LM goes on PYTHONPATH too
        path = [str(HERE / "mlm_cpu_shim"), str(mlm), *map(str, args.extra_site)]
        env["PYTHONPATH"] = os.pathsep.join([*path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.update(DSE_MLM_CPU_SHIM="1", TORCHDYNAMO_DISABLE="1")
    kinds = [args.only] if args.only else list(KINDS)
    # rows of earlier calls on the same OUT (a repeat as a second command) are kept
    saved = out / "rows.json"
    rows: dict[str, dict[str, list[dict[str, Any]]]] = (
        json.loads(saved.read_text()) if saved.is_file() else {}
    )
    done = json.loads((out / "rounds.json").read_text()) if (out / "rounds.json").is_file() else {}
    for kind in kinds:
        rows.setdefault(kind, {})
    for _ in range(args.rounds):
        for kind in kinds:
            r = done.get(kind, 0)
            done[kind] = r + 1
            sp = _variant(data, out, kind, f"r{r}", sets, mlm)
            study = yaml.safe_load(sp.read_text())["study"]
            with open(out / f"{study}.log", "w") as log:
                rc = subprocess.run(
                    [sys.executable, "-m", "dse.cli", "start", "--space", str(sp),
                     "--storage", db],
                    stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out,
                ).returncode  # fmt: skip
            if rc != 0:
                sys.stdout.write(f"{study}: dse start exited {rc} (see {out}/{study}.log)\n")
            try:
                trials = _results(db, study)
            except subprocess.CalledProcessError as e:
                sys.stdout.write(f"{study}: no trials to read ({e.stderr.strip()[-300:]})\n")
                trials = []
            for t in trials:
                key = json.dumps({k: t["params"].get(k) for k in sorted(sets)})
                rows[kind].setdefault(key, []).append(_row(t))
            saved.write_text(json.dumps(rows))
            (out / "rounds.json").write_text(json.dumps(done))
            report = _report(rows)  # after every study: a run cut short keeps its report
            (out / "report.json").write_text(json.dumps({"rows": rows, **report}, indent=1))
            (out / "report.txt").write_text(report["text"])
            sys.stdout.write(f"{study}: done\n")
            sys.stdout.flush()
    report = _report(rows)
    sys.stdout.write(report["text"])
    return 0 if report["complete"]["upstream" if "upstream" in rows else kinds[0]] else 1


def _report(rows: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    lines = [
        f"{'configuration':<72} {'workload':<9} {'state':<9} {'dse step s':>10} "
        f"{'log step s':>10} {'dse TF/s':>9} {'log TF/s':>9} {'peak GiB':>8}  check"
    ]
    best: dict[str, tuple[float, str]] = {}
    complete: dict[str, int] = {}
    agree: list[float] = []
    by_cfg_median: dict[str, dict[str, float]] = {}
    spread: dict[str, dict[str, float]] = {}
    for kind, by_cfg in rows.items():
        complete[kind] = 0
        for key, ts in sorted(by_cfg.items()):
            tfs = []
            for t in ts:
                ok = t["state"] == "complete"
                complete[kind] += ok
                if ok and t["tflops_per_gpu"] is not None:
                    tfs.append(t["tflops_per_gpu"])
                if ok and t["step_time_s"] and t["step_time_s_log"]:
                    agree.append(abs(t["step_time_s"] / t["step_time_s_log"] - 1.0))
                state = "complete" if ok else str(t.get("failure_class"))
                check = t.get("resolved_check") or t.get("reason") or ""
                lines.append(
                    f"{key:<72} {kind:<9} {state:<9} {_fmt(t['step_time_s'], '.5f'):>10} "
                    f"{_fmt(t['step_time_s_log'], '.5f'):>10} {_fmt(t['tflops_per_gpu']):>9} "
                    f"{_fmt(t['tflops_per_gpu_log']):>9} {_fmt(t['peak_mem_gib']):>8}  "
                    f"{check[:160]}"
                )
            if tfs:
                med = statistics.median(tfs)
                by_cfg_median.setdefault(kind, {})[key] = med
                spread.setdefault(kind, {})[key] = (max(tfs) - min(tfs)) / med if med else 0.0
                if med > best.get(kind, (0.0, ""))[0]:
                    best[kind] = (med, key)
    lines.append("")
    for kind, (tf, key) in best.items():
        lines.append(
            f"best {kind}: {tf:.4g} TFLOP/s/GPU (dse's FLOPs, median over rounds) at {key}"
        )
    if "upstream" in best and "builtin" in by_cfg_median:
        tf, key = best["upstream"]
        b = by_cfg_median["builtin"].get(key)
        if b:
            lines.append(f"upstream / built-in on that configuration: {tf / b:.4f}")
    if agree:
        lines.append(
            f"dse step time vs the log's own (same run): max |ratio-1| = {max(agree):.2e}"
        )
    for kind, sp in spread.items():
        if sp:
            lines.append(f"{kind}: TFLOP/s spread over rounds (max-min)/median, worst config "
                         f"{max(sp.values()):.3%}")  # fmt: skip
    lines.append(f"complete trials: {complete}")
    return {"text": "\n".join(lines) + "\n", "complete": complete, "best": best,
            "step_time_agreement": max(agree) if agree else None, "spread": spread}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
