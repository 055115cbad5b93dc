"""``dse report --study S -o DIR``: a study report as one self-contained HTML page (plots
inlined), a Markdown file and PNG plots, drawn from :func:`dse.report.plots.study_plot_data`.

Figures are shown with :func:`dse.core.figures.figure`; estimates say so where they are shown.
Needs matplotlib (the ``report`` extra).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from dse import install_hint
from dse.core.exceptions import DSEError
from dse.core.figures import figure
from dse.core.records import VERIFY_ATTR
from dse.report.plots import slice_label, study_plot_data
from dse.results.gpu_usage import ACCOUNT_PARTS
from dse.storage.locate import open_existing as _open_existing
from dse.storage.locate import pick_study as _pick_study

__all__ = ["register", "write_report", "cmd_report"]

_PLOTS = ("history", "pareto", "importance", "slices", "failures", "timeline", "losses")


def _plot_names(data: dict[str, Any]) -> tuple[str, ...]:
    """The plots of this report: the comparison only when other studies of the model exist."""
    return _PLOTS + (("compare",) if data.get("compare") else ())


#: Small multiples per row of the slices plot.
SLICE_COLUMNS = 4


_ARG = re.compile(r"(-{1,2}[^\s]+ (?!-)[^\s\\]+|[^\s]+)")


def _args_html(text: str) -> str:
    """Launcher text as HTML whose lines break between arguments, never inside a flag at its
    hyphens: each argument (a flag with its value) in a no-wrap span, the spaces between them
    as they are (the text copies unchanged)."""
    return _ARG.sub(lambda m: f"<span class='arg'>{html.escape(m.group(0))}</span>", text)


def _short(label: str, n: int = 14) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def _plots(data: dict[str, Any], out: Path) -> dict[str, Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise DSEError(f"the report needs matplotlib ({install_hint('report')}): {e}") from e
    files: dict[str, Path] = {}
    metric = data["metric"]

    def save(fig: Any, name: str) -> None:
        p = out / f"{name}.png"
        with warnings.catch_warnings():  # a nearly empty plot cannot always be tightened
            warnings.simplefilter("ignore", UserWarning)
            fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)
        files[name] = p

    h = data["history"]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ok = [r for r in h if r["value"] is not None]
    bad = [r for r in h if r["value"] is None]
    ax.scatter([r["number"] for r in ok], [r["value"] for r in ok], label="complete", s=18)
    ax.step([r["number"] for r in h if r["best_so_far"] is not None],
            [r["best_so_far"] for r in h if r["best_so_far"] is not None],
            where="post", color="C2", label="best so far")  # fmt: skip
    if bad and ok:
        lo = min(r["value"] for r in ok)
        ax.scatter([r["number"] for r in bad], [lo] * len(bad), marker="x", color="C3",
                   label="failed / infeasible (no value)")  # fmt: skip
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("History")
    ax.legend(fontsize=7)
    save(fig, "history")

    par = data["pareto"]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    pts = par["points"]
    on = set(par["front"])
    ax.scatter([p["peak_mem_gib"] for p in pts if p["number"] not in on],
               [p["tflops_per_gpu"] for p in pts if p["number"] not in on], s=18,
               label="trial")  # fmt: skip
    fr = sorted((p for p in pts if p["number"] in on), key=lambda p: p["peak_mem_gib"])
    ax.plot([p["peak_mem_gib"] for p in fr], [p["tflops_per_gpu"] for p in fr], "o-",
            color="C1", label="Pareto front")  # fmt: skip
    if par.get("gpu_memory_gib"):
        ax.axvline(par["gpu_memory_gib"], color="C3", ls="--", lw=1, label="GPU memory")
    ax.set_xlabel("peak memory (GiB)")
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("TFLOP/s vs memory")
    ax.legend(fontsize=7)
    save(fig, "pareto")

    imp = data["importance"] or {}
    fig, ax = plt.subplots(figsize=(6, 1.8 + 0.28 * len(imp)))
    names = list(imp)[::-1]
    ax.barh(names, [imp[n] for n in names])
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("importance (PED-ANOVA)")
    ax.set_title("Knob importance" + ("" if imp else f": {data['importance_how']}"))
    save(fig, "importance")

    sl = data["slices"]
    n = max(len(sl), 1)
    # small multiples wrapped into rows of SLICE_COLUMNS (20-30 knobs: a page, not a strip)
    cols = min(n, SLICE_COLUMNS)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(2.6 * cols, 0.4 + 2.3 * nrows),
                             squeeze=False, sharey=True)  # fmt: skip
    flat = [ax for row in axes for ax in row]
    for ax, (k, rows) in zip(flat, sl.items(), strict=False):
        order = data["slice_values"][k]  # the domain's order, not the trials'
        labels = [slice_label(r["x"]) for r in rows]
        xs = [order.index(x) if x in order else -1 for x in labels]
        ax.scatter(xs, [r["value"] for r in rows], s=14)
        ax.set_xticks(range(len(order)), [_short(x) for x in order], rotation=25, ha="right")
        ax.set_title(k if len(k) <= 30 else k[:29] + "…", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in flat[len(sl) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(metric, fontsize=8)
    save(fig, "slices")

    fails = data["failures"]
    kinds = {k: len(v) for k, v in fails.items()}
    for r in data["rejected"]:
        key = f"rejected: {r['kind']}"
        kinds[key] = kinds.get(key, 0) + 1
    fig, ax = plt.subplots(figsize=(6, 1.8 + 0.4 * len(kinds)))
    ax.barh(list(kinds), list(kinds.values()), color="C3")
    ax.set_xlabel("trials")
    ax.set_title("Failures by class" + ("" if kinds else ": none"))
    save(fig, "failures")

    _timeline_plot(plt, data["timeline"], save)
    _losses_plot(plt, data["losses"], save)
    if data.get("compare"):
        _compare_plot(plt, data["compare"], data["study"], save)
    return files


def _timeline_plot(plt: Any, tl: dict[str, Any], save: Any) -> None:
    """Trials per GPU slot: a lane per slot, bars coloured by state, idle gaps grey."""
    lanes = [x["label"] for x in tl["lanes"]]
    colors, k = tl["colors"], tl["scale"]
    row = {name: i for i, name in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.32 * max(len(lanes), 1)))
    if tl["gaps"]:
        g = tl["gaps"]
        ax.barh([row[x["lane"]] for x in g], [x["duration_s"] / k for x in g],
                left=[x["start"] / k for x in g], height=0.6, color=colors["idle"],
                edgecolor="#9ca3af", label="idle")  # fmt: skip
    for st in dict.fromkeys(b["state"] for b in tl["bars"]):
        bars = [b for b in tl["bars"] if b["state"] == st]
        ax.barh([row[b["lane"]] for b in bars], [b["duration_s"] / k for b in bars],
                left=[b["start"] / k for b in bars], height=0.6,
                color=colors.get(st, "#6b7280"), edgecolor="white", label=st)  # fmt: skip
    ticks = [
        x["label"]
        if x["busy_fraction"] is None
        else f"{x['label']} ({figure(100 * x['busy_fraction'])}%)"
        for x in tl["lanes"]
    ]
    ax.set_yticks(range(len(lanes)), ticks, fontsize=7)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlabel(f"time since the first start ({tl['unit']})")
    ax.set_title("Timeline: trials per GPU slot" + ("" if lanes else ": no trial has started"))
    if lanes:
        ax.legend(fontsize=7, ncol=6, loc="lower center", bbox_to_anchor=(0.5, 1.0),
                  frameon=False)  # fmt: skip
        ax.set_title("Timeline: trials per GPU slot", pad=22)
    save(fig, "timeline")


def _losses_plot(plt: Any, ls: dict[str, Any], save: Any) -> None:
    """The loss per step of the best trials over the baseline's (dashed)."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    drawn = 0
    for c in ls["curves"]:
        pts = [(x, y) for x, y in zip(c["steps"], c["loss"], strict=False) if y is not None]
        if not pts:
            continue
        drawn += 1
        xs, ys = zip(*pts, strict=True)
        if c["baseline"]:
            ax.plot(xs, ys, ls="--", lw=2.5, color=ls["colors"]["baseline"], zorder=1,
                    label=f"baseline (trial {c['number']})")  # fmt: skip
        else:
            changed = c["numerics"] == "changed"
            name = f"trial {c['number']}" + (" (numerics changed)" if changed else "")
            ax.plot(xs, ys, ls=":" if changed else "-", lw=1.5, marker="o", ms=3, zorder=2,
                    label=name)  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Loss per step over the baseline's" + ("" if drawn else ": no loss recorded"))
    if drawn:
        ax.legend(fontsize=7)
    save(fig, "losses")


def _compare_plot(plt: Any, cmp: dict[str, Any], me: str, save: Any) -> None:
    """The best TFLOP/s per GPU and step time of each study of the model (interval bars)."""
    rows = cmp["studies"]
    names = [f"{r['study']}\n{r['gpu'] or r['device']} x{r['world_size']}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (k, ci) in zip(axes, (("tflops_per_gpu", "tflops_per_gpu_ci"),
                                  ("step_time_s", "step_time_ci_s")), strict=True):  # fmt: skip
        best = [r["best"] or {} for r in rows]
        ys = [b.get(k) or 0.0 for b in best]
        colors = ["C0" if r["study"] == me else "0.6" for r in rows]
        ax.bar(range(len(rows)), ys, color=colors)
        iv = [(i, b) for i, b in enumerate(best) if b.get(ci) and b.get(k) is not None]
        if iv:  # interval bars where measured
            ax.errorbar([i for i, _ in iv], [b[k] for _, b in iv], fmt="none", ecolor="k",
                        capsize=4, yerr=[[b[k] - b[ci][0] for _, b in iv],
                                         [b[ci][1] - b[k] for _, b in iv]])  # fmt: skip
        ax.set_xticks(range(len(rows)), names, fontsize=7)
        ax.set_ylabel(cmp["figures"][k])
    axes[0].set_title("Best of each study of the model", fontsize=9)
    save(fig, "compare")


def _money(x: float | None) -> str:
    return "" if x is None else f"${figure(x)}"


def _busy_rows(g: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The shares of the held device time (``dse.results.gpu_usage.busy_shares``): in measured
    steps, in any device work of a trial (builds, first and warm-up steps), and the first
    step's cost per trial (measured)."""

    def share(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    if g.get("measured_fraction") is None:
        return []
    dev = "GPU" if g.get("device") == "cuda" else "device (CPU rank)"
    rows = [
        ("busy-measured", f"held {dev} time in measured steps", share(g["measured_fraction"])),
        ("busy-kernel", f"held {dev} time in builds and all steps", share(g["kernel_fraction"])),
        ("busy-steps", f"held {dev} time in all steps (warm-up included)",
         share(g.get("busy_fraction"))),
    ]  # fmt: skip
    if g.get("first_step_s_median") is not None:
        med, top = figure(g["first_step_s_median"]), figure(g["first_step_s_max"])
        rows.append(("first-step", "first step of a trial (compilation; median / max, s)",
                     f"{med} / {top}"))  # fmt: skip
    acc = g.get("accounting")
    if acc:
        for key, what in ACCOUNT_PARTS:
            rows.append((f"held-{key.replace('_', '-')}", f"held {dev} time: {what}",
                         f"{figure(acc['seconds'][key])} s, {share(acc['shares'][key])}, "
                         f"{figure(acc['per_trial_s'][key])} s per trial"))  # fmt: skip
    return rows


#: What a CPU-clock study's step times are (``measurement.clock: cpu``, the CPU demo).
CPU_CLOCK_NOTE = ("step times are the CPU time a trial spent in a step (measurement.clock cpu; "
                  "its wall time also counts waiting for a core), TFLOP/s and tokens/s per GPU "
                  "follow from them")  # fmt: skip


def _cpu_clock(m: dict[str, Any]) -> bool:
    """Whether a trial's metrics (or a comparison row's best) time steps by CPU time."""
    return m.get("step_clock") == "cpu"


def _trust_section(tr: dict[str, Any], metric: str) -> tuple[str, list[tuple[str, str, str]], str]:
    """How far the study's estimates are to be trusted (dse.results.trust): the counts by
    label, the highest estimate and the best within the measured range beside it."""

    def one(t: dict[str, Any] | None) -> str:
        if not t:
            return "none: every estimate is extrapolated"
        why = f" ({t['why']})" if t["label"] == "extrapolated" and t.get("why") else ""
        return (
            f"trial {t['number']}, {metric} {figure(t['value'])}, {t['label']}{why}: "
            + json.dumps(t["params"], sort_keys=True)
        )

    counts = ", ".join(f"{n} {label}" for label, n in sorted(tr["counts"].items()))
    rows = [
        ("trust-counts", "estimates by trust", counts),
        ("trust-best", "highest estimate", one(tr["best"])),
        ("trust-calibrated-best", "best within the measured range", one(tr["trusted_best"])),
    ]
    note = (
        "estimates (cost model): calibrated = a measured layout of this model; interpolated = "
        "inside a measured range of its family; extrapolated = outside every measured range, "
        "never a best on its own"
    )
    return ("Estimates' trust", rows, note)


def _sections(data: dict[str, Any]) -> list[tuple[str, list[tuple[str, str, str]], str]]:
    """(title, rows of (id, label, value), note) for the page and the Markdown."""
    b = data["best"]
    c = data["counts"]
    secs: list[tuple[str, list[tuple[str, str, str]], str]] = []
    rows = [
        ("count-total", "trials", str(c.get("total", 0))),
        ("count-complete", "complete", str(c.get("complete", 0))),
        ("count-failed", "failed", str(c.get("failed", 0))),
        ("count-infeasible", "infeasible", str(c.get("infeasible", 0))),
        ("count-pruned", "pruned (stopped early, dominated)", str(c.get("pruned", 0))),
        ("count-rejected", "rejected before launch", str(sum(data["rejections"].values()))),
    ]
    source = data.get("source", "measured")
    what = data.get("source_text", source)
    secs.append(("Trials", rows, what))
    if b:
        m = b["metrics"]
        cpu = _cpu_clock(m)
        step = "CPU time per step (s)" if cpu else "step time (s)"
        rows = [
            ("best-trial", "trial", str(b["trial"])),
            ("best-value", f"{data['metric']} ({data['direction']})",
             figure(b["objective"]["value"])),
            ("best-tflops", "TFLOP/s per GPU", figure(m.get("tflops_per_gpu"))),
            ("best-step", step, figure(m.get("step_time_s"))),
            ("best-mem", "peak memory (GiB)", figure(m.get("peak_mem_gib"))),
            ("best-params", "configuration", json.dumps(b["params"], sort_keys=True)),
        ]  # fmt: skip
        cis = [
            ("best-tflops-ci", "TFLOP/s per GPU, 95% interval", m.get("tflops_per_gpu_ci")),
            ("best-step-ci", f"{step}, 95% interval", m.get("step_time_ci_s")),
        ]
        shown = [(i, label, f"{figure(v[0])}–{figure(v[1])}") for i, label, v in cis
                 if isinstance(v, list) and len(v) == 2]  # fmt: skip
        rows[5:5] = shown  # after the figures they qualify
        if cpu:  # the wall time beside the CPU time (the best trial's own)
            runs = (b.get("noise") or {}).get("trials") or [b["trial"]]
            own = f", trial {b['trial']}" if len(runs) > 1 else ""
            rows.insert(4, ("best-wall", f"wall time per step (s{own})",
                            figure(m.get("step_wall_time_s"))))  # fmt: skip
        numerics = m.get("numerics")
        if isinstance(numerics, dict) and numerics.get("status"):
            rows.append(("best-numerics", "numerics against the baseline",
                         str(numerics["status"])))  # fmt: skip
        noise = b.get("noise") or {}
        runs = noise.get("trials") or [b["trial"]]
        if len(runs) > 1:
            rows.insert(1, ("best-pooled", "runs pooled",
                            f"{len(runs)}: trials {', '.join(map(str, runs))}"))  # fmt: skip
        rows.insert(1, ("best-tie", "tied within noise",
                        noise.get("message") or "no: the best is ahead of every other "
                        "configuration's interval"))  # fmt: skip
        model = (noise.get("model") or {}).get("text")
        if model and noise.get("kind") != "estimate":
            rows.insert(2, ("best-noise", "noise model (every interval)", model))
        if source == "estimate":
            note = ("estimate (cost model, workload sim): nothing was measured; its interval "
                    "is the synthetic series' own")  # fmt: skip
        else:
            note = (f"{what}; the configuration's figures pooled over its runs; intervals: 95%"
                    if shown else f"{what} (no confidence interval: a repeated run is needed "
                    "for one)")  # fmt: skip
        if cpu:
            note += f"; {CPU_CLOCK_NOTE}"
        secs.append(("Best configuration", rows, note))
    tr = data.get("trust")
    if tr:
        secs.append(_trust_section(tr, data["metric"]))
    g = data["gpu"]
    if g.get("estimate_trials"):  # a sim study: nothing ran on a GPU
        rows = [("gpu-spent", "GPU-hours spent", "0 (cost-model estimates: no GPU used)")]
    else:
        rows = [
            ("gpu-spent", "GPU-hours spent", figure(g["spent_gpu_hours"])),
            ("gpu-grid", "configurations in the full grid", str(g["grid_configurations"])),
            ("gpu-full", "GPU-hours of the full grid (estimate)",
             figure(g["full_grid_gpu_hours"])),
            ("gpu-saved", "GPU-hours saved (estimate)", figure(g["saved_gpu_hours"])),
        ]  # fmt: skip
        if g.get("cost_per_gpu_hour") is not None:
            rows += [
                ("cost-spent", f"spent at ${figure(g['cost_per_gpu_hour'])}/GPU-hour",
                 _money(g.get("spent_cost"))),
                ("cost-saved", "saved (estimate)", _money(g.get("saved_cost"))),
            ]  # fmt: skip
        rows += _busy_rows(g)
    secs.append(("GPU-hours", rows, g["label"]))
    p = data["projection"]
    rows = [("proj-tokens", "tokens", figure(p["tokens"]))]
    for who in ("best", "baseline"):
        q = p[who]
        if q:
            rows += [
                (f"proj-{who}-days", f"{who}: days (estimate)", figure(q["days"])),
                (f"proj-{who}-gpuh", f"{who}: GPU-hours (estimate)", figure(q["gpu_hours"])),
            ]
            if "cost" in q:
                rows.append((f"proj-{who}-cost", f"{who}: cost (estimate)", _money(q["cost"])))
    if p["speedup_over_baseline"]:
        rows.append(("proj-speedup", f"speed-up over the baseline (trial {p['baseline_trial']})",
                     f"{figure(p['speedup_over_baseline'])}x"))  # fmt: skip
        rows.append(("proj-days-saved", "days saved (estimate)", figure(p["days_saved"])))
    label = p["label"]
    if b and _cpu_clock(b["metrics"]):
        label += "; the step time is CPU time (measurement.clock cpu), not wall time"
    secs.append(("Projection of a full training run", rows, label))
    v = data.get("verify")
    if v:
        secs.append(_verify_section(v))
    return secs


def _verify_section(v: dict[str, Any]) -> tuple[str, list[tuple[str, str, str]], str]:
    """The last ``dse verify``: the verdict and each long run's losses and reload."""
    why = "; ".join(v.get("reasons") or [])
    rows = [("verify-verdict", "verdict", v["verdict"] + (f": {why}" if why else ""))]
    for who in ("best", "baseline"):
        r = v.get(who)
        if not r:
            continue
        if r.get("error"):
            rows.append((f"verify-{who}", f"{who}: run", f"failed: {r['error']}"))
            continue
        rows += [
            (f"verify-{who}-loss", f"{who}: first / last loss",
             f"{figure(r['first_loss'])} / {figure(r['last_loss'])}"),
            (f"verify-{who}-reload", f"{who}: checkpoint reload",
             "ok" if r["reload_ok"] else str(r.get("reload_reason"))),
        ]  # fmt: skip
    if v.get("loss_drift") is not None:
        rows.append(("verify-drift", "last-loss drift against the baseline",
                     f"{100 * v['loss_drift']:+.3g}%"))  # fmt: skip
    note = f"dse verify: {v['steps']} steps each, a checkpoint saved midway and reloaded"
    return (f"Verify (trial {v['best_trial']})", rows, note)


_COMPARE_HEAD = ("study", "GPU", "recipe", "seq", "GBS", "best trial", "TFLOP/s per GPU",
                 "step time (s)", "peak memory (GiB)", "GPU-hours")  # fmt: skip


def _compare_cells(r: dict[str, Any]) -> list[str]:
    b = r["best"] or {}

    def fig(k: str, ci: str | None = None) -> str:
        v = figure(b.get(k))
        iv = b.get(ci) if ci else None
        return f"{v} ({figure(iv[0])}–{figure(iv[1])})" if v and iv else v

    trial = "" if not b else str(b["trial"]) + (" (estimate)" if b.get("source") == "estimate"
                                               else "")  # fmt: skip
    step = fig("step_time_s", "step_time_ci_s")
    if step and _cpu_clock(b):  # CPU time (measurement.clock cpu): say so, the wall time beside
        step += f" CPU time; {figure(b.get('step_wall_time_s'))} wall"
    return [r["study"], f"{r['gpu'] or r['device']} x{r['world_size']}",
            str(r["recipe"] or f"{r['workload']} workload"), str(r["seq_length"]),
            str(r["global_batch_size"]), trial, fig("tflops_per_gpu", "tflops_per_gpu_ci"),
            step, fig("peak_mem_gib"), figure(r["gpu_hours"])]  # fmt: skip


def _compare_html(cmp: dict[str, Any]) -> list[str]:
    e = html.escape
    out = ["<h2>This model on other hardware or recipes</h2><table id='compare'><tr>"
           + "".join(f"<th>{e(h)}</th>" for h in _COMPARE_HEAD) + "</tr>"]  # fmt: skip
    for r in cmp["studies"]:
        out.append(f"<tr data-study='{e(r['study'])}'>"
                   + "".join(f"<td>{e(c)}</td>" for c in _compare_cells(r)) + "</tr>")  # fmt: skip
    out.append(f"</table><p class='note'>{e(cmp['label'])}</p>")
    return out


def _compare_md(cmp: dict[str, Any]) -> list[str]:
    md = ["## This model on other hardware or recipes", "",
          "| " + " | ".join(_COMPARE_HEAD) + " |", "|" + "---|" * len(_COMPARE_HEAD)]  # fmt: skip
    md += ["| " + " | ".join(_compare_cells(r)) + " |" for r in cmp["studies"]]
    return [*md, "", f"_{cmp['label']}_", ""]


def write_report(data: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write report.html, report.md and the PNG plots into ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    pngs = _plots(data, out)
    secs = _sections(data)
    e = html.escape
    title = f"dse study report: {data['study']}"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{e(title)}</title><style>body{{font-family:sans-serif;max-width:1000px;"
        "margin:1em auto;color:#222}table{border-collapse:collapse;margin:.4em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:14px}"
        ".note{color:#666;font-size:12px}pre{background:#f4f4f4;padding:6px;white-space:"
        "pre-wrap;font-size:12px}pre .arg{white-space:nowrap}img{max-width:100%}</style>"
        "</head><body>",
        f"<h1>{e(title)}</h1><p>{e(str(data.get('recipe') or ''))} &middot; objective "
        f"{e(data['metric'])} ({e(data['direction'])}) &middot; "
        f"{e(str(data['hardware'].get('gpu') or ''))} x {data['hardware'].get('world_size')}</p>",
    ]
    md = [f"# {title}", "", f"objective {data['metric']} ({data['direction']})", ""]
    for name, rows, note in secs:
        parts.append(f"<h2>{e(name)}</h2><table>")
        md += [f"## {name}", "", "| | |", "|---|---|"]
        for rid, label, value in rows:
            parts.append(f"<tr><th>{e(label)}</th><td id='{rid}'>{e(value)}</td></tr>")
            md.append(f"| {label} | {value} |")
        parts.append(f"</table><p class='note'>{e(note)}</p>")
        md += ["", f"_{note}_", ""]
        if name == "Best configuration":
            for fmt in ("megatron", "bridge", "nemo"):
                text = data["exports"].get(fmt)
                shown = text if text is not None else "(not expressible: "
                if text is None:
                    shown += f"{data['exports'].get(fmt + '_why', '')})"
                parts.append(f"<h3>{fmt}</h3><pre id='export-{fmt}'>{_args_html(shown)}</pre>")
                md += [f"**{fmt}**", "", "```", shown, "```", ""]
    imp = data["importance"]
    parts.append("<h2>Knob importance</h2>")
    md += ["## Knob importance", ""]
    if imp:
        parts.append("<table>")
        for k, v in imp.items():
            parts.append(f"<tr><th>{e(k)}</th><td class='imp'>{figure(v)}</td></tr>")
            md.append(f"- {k}: {figure(v)}")
        parts.append("</table>")
    parts.append(f"<p class='note'>{e(data['importance_how'])}</p>")
    md += ["", f"_{data['importance_how']}_", ""]
    parts.append("<h2>Failures</h2><table><tr><th>class</th><th>trial</th><th>reason</th></tr>")
    md += ["## Failures", ""]
    for cls, items in data["failures"].items():
        for it in items:
            parts.append(f"<tr><td>{e(cls)}</td><td>{it['number']}</td>"
                         f"<td>{e(str(it['reason'] or ''))}</td></tr>")  # fmt: skip
            md.append(f"- {cls}: trial {it['number']}: {it['reason']}")
    for r in data["rejected"]:
        parts.append(f"<tr><td>rejected: {e(r['kind'])}</td><td>-</td>"
                     f"<td>{e(r['rule'])}: {e(r['reason'])}</td></tr>")  # fmt: skip
        md.append(f"- rejected ({r['kind']}): {r['rule']}: {r['reason']}")
    parts.append("</table>")
    md.append("")
    tl, ls = data["timeline"], data["losses"]
    busy = tl["busy_fraction"]
    tl_text = (
        f"{len(tl['lanes'])} slots, {tl['trials_shown']} trials, {tl['runs']} runs"
        + ("" if busy is None else f", busy {figure(100 * busy)}% of the time")
        + f"; {tl['label']}"
    )
    parts.append(f"<h2>Timeline</h2><p class='note' id='timeline-note'>{e(tl_text)}</p>")
    md += ["## Timeline", "", f"_{tl_text}_", ""]
    base = ls["baseline"]
    shown = [c["number"] for c in ls["curves"] if not c["baseline"]]
    text = f"baseline: trial {base} ({ls['baseline_how']})" if base is not None else ""
    text = (
        text or ls["baseline_how"]
    ) + f"; over it: trials {', '.join(map(str, shown)) or 'none'}"
    parts.append(f"<h2>Loss curves</h2><p class='note' id='losses-note'>{e(text)}</p>")
    md += ["## Loss curves", "", f"_{text}_", ""]
    if data.get("compare"):
        parts += _compare_html(data["compare"])
        md += _compare_md(data["compare"])
    for name in _plot_names(data):
        b64 = base64.b64encode(pngs[name].read_bytes()).decode()
        parts.append(f"<h2>{name}</h2><img id='plot-{name}' alt='{name}' "
                     f"src='data:image/png;base64,{b64}'>")  # fmt: skip
        md += [f"![{name}]({name}.png)", ""]
    parts.append("</body></html>")
    (out / "report.html").write_text("\n".join(parts))
    (out / "report.md").write_text("\n".join(md) + "\n")
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    return {"html": out / "report.html", "md": out / "report.md", **pngs}


def cmd_report(args: argparse.Namespace) -> int:
    storage = _open_existing(args)  # read-only: a mistyped --storage creates nothing
    try:
        st = _pick_study(storage, args.study)
        data = study_plot_data(
            storage, st, cost_per_gpu_hour=args.cost_per_gpu_hour, tokens=args.tokens
        )
        data["verify"] = storage.get_study_attrs(st.id).get(VERIFY_ATTR)
    finally:
        storage.close()
    paths = write_report(data, Path(args.output))
    sys.stderr.write(f"dse: wrote the report of {st.name!r} to {paths['html']}\n")
    return 0


def register(sub: Any) -> None:
    sp = sub.add_parser("report", help="a study report: HTML, Markdown and PNG plots")
    sp.add_argument("--study")
    sp.add_argument("-o", "--output", required=True, help="folder to write")
    sp.add_argument("--cost-per-gpu-hour", type=float, help="money per GPU-hour (e.g. 3.0)")
    sp.add_argument(
        "--tokens", type=float, default=1e12, help="tokens of the projected run (default 1e12)"
    )
    sp.add_argument("--storage", help="SQLAlchemy URL (default: $DSE_STORAGE, sqlite:///dse.db)")
    sp.set_defaults(fn=cmd_report)
