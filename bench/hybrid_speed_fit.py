"""Fit the host-bound time of a hybrid model's Mamba and MoE layers on the local spec.

    python bench/hybrid_speed_fit.py [examples/studies/h200_hybrid_proxy_study_1gpu.jsonl]

Least squares over the ok rows of a measured hybrid table: measured step time =
``scale`` x the estimated step time without the host term + micro-batches x (Mamba + MoE
layers) x ``layer_s``. Prints both and the fit's largest relative residual; ``layer_s`` is
``dse.model.costmodel.throughput.LOCAL_HYBRID_LAYER_S`` (an estimate's constant).
"""

from __future__ import annotations

import json
import sys
from unittest import mock

import numpy as np

from dse.model.costmodel import throughput
from dse.model.costmodel._layout import resolve
from dse.model.costmodel.table import row_problem
from dse.stats.table import read_table


def fit(path: str) -> dict[str, float]:
    xs, ys = [], []
    with mock.patch.object(throughput, "LOCAL_HYBRID_LAYER_S", 0.0):
        for r in read_table(path):
            if r.status != "ok":
                continue
            model, sem, res, params = row_problem(r)
            est = throughput.estimate_throughput(model, sem, res, params)["step_time_s"]
            kinds = model.layer_counts()
            m = resolve(model, sem, res, params).num_microbatches
            xs.append([est, m * (kinds["mamba"] + kinds["moe"])])
            ys.append(float(r.metrics["step_time_s"]))
    a = np.asarray(xs)
    y = np.asarray(ys)
    (scale, layer_s), *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = np.abs(a @ np.array([scale, layer_s]) - y) / y
    return {
        "rows": len(ys),
        "scale": round(float(scale), 4),
        "layer_s": round(float(layer_s), 5),
        "max_rel_residual": round(float(resid.max()), 4),
    }


if __name__ == "__main__":
    default = "examples/studies/h200_hybrid_proxy_study_1gpu.jsonl"
    table = sys.argv[1] if len(sys.argv) > 1 else default
    sys.stdout.write(json.dumps(fit(table)) + "\n")
