"""How the cost model's speed estimate ranks configurations measured by
``bench/adaptive_window.py`` (its fixed-window step times), per result file.

    python bench/estimate_rank.py docs/results/adaptive_window_h200_gbs8_p1.json [...]

Each file names its space and ``--set`` overrides in ``args`` (the ``knobs.`` ones only
narrow the domain and are skipped); each row's configuration is estimated with
``dse.model.costmodel`` and compared with its measured fixed-window step time. Prints, per file,
Kendall's tau between estimate and measurement and how far the estimate's fastest
configuration measured from the measured fastest (1.000: it is the fastest). The estimates
are estimates; the step times are the file's measurements.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml
from scipy.stats import kendalltau

from dse.model.costmodel import CostModel
from dse.space.searchspace import parse_space

REPO = Path(__file__).resolve().parents[1]


def _space(args: dict[str, Any]) -> Any:
    raw = yaml.safe_load((REPO / args["space"]).read_text())
    for item in args.get("set") or []:
        key, _, value = item.partition("=")
        if key.startswith("knobs."):
            continue
        node = raw
        *path, last = key.split(".")
        for k in path:
            node = node[k]
        node[last] = yaml.safe_load(value)
    return parse_space(raw)


def rank(path: str) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    sp = _space(data["args"])
    cm = CostModel(sp.model, sp.semantics, sp.resources)
    rows = [r for r in data["rows"] if r.get("fixed_step_s")]
    est = [float(cm.estimate_throughput(sp.full_params(r["params"]))["step_time_s"]) for r in rows]
    meas = [float(r["fixed_step_s"]) for r in rows]
    top = min(range(len(rows)), key=lambda i: est[i])
    return {
        "file": path,
        "global_batch_size": sp.semantics.global_batch_size,
        "seq_length": sp.semantics.seq_length,
        "configurations": len(rows),
        "kendall_tau": float(kendalltau(est, meas).statistic),
        "estimate_best_over_measured_best": meas[top] / min(meas),
        "estimate_best": rows[top]["params"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = [rank(f) for f in args.files]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for r in out:
        print(f"{r['file']}: GBS {r['global_batch_size']}, seq {r['seq_length']}, "
              f"{r['configurations']} configurations, Kendall tau {r['kendall_tau']:.3f}, "
              f"estimate's best measured {r['estimate_best_over_measured_best']:.3f}x the "
              f"best step time")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
