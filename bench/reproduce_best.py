"""Do several runs of one study agree on the answer? ``python bench/reproduce_best.py DB...``

Each database holds one run of the same study (the README demo run again, one folder each).
For each run: its noise-aware best (``dse.results.noise.study_best``), the tied set, the noise
model. Then, across runs, by configuration (canonical knob values):

* every run's named best lies in every other run's answer (its best or its tied set);
* no run separates two configurations (intervals apart) in one order while another run
  measured them the other way round (its pooled means in the opposite order).

Prints one block per run and the two checks; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any

from dse.core.figures import figure
from dse.results.noise import ConfigEstimate, study_best
from dse.results.run_settings import effective_space
from dse.storage import open_storage


def _run(url: str) -> dict[str, Any]:
    with open_storage(url) as st:
        study = st.list_studies()[0]
        space = effective_space(study.space_yaml, study.name, st.get_study_attrs(study.id))
        nb = study_best(st, study, space)
        if nb is None:
            raise SystemExit(f"{url}: no complete trial")
    ranking: dict[str, ConfigEstimate] = {c.key: c for c in nb.ranking}
    return {"url": url, "nb": nb, "ranking": ranking}


def _name(c: ConfigEstimate) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(c.params.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dbs", nargs="+", help="SQLite files (or storage URLs), one run each")
    args = ap.parse_args(argv)
    runs = [_run(d if "://" in d else f"sqlite:///{d}") for d in args.dbs]
    ok = True
    for i, r in enumerate(runs, 1):
        nb = r["nb"]
        m = nb.model
        print(f"run {i}: {nb.answer}")
        print(f"  noise model: rel_sd {m.rel_sd:.3g} (prior {m.prior:.3g}, learned "
              f"{'-' if m.learned is None else f'{m.learned:.3g}'} on {m.dof} dof)")  # fmt: skip
        for c in nb.ranking:
            lo, hi = c.objective.bounds
            mark = "best" if c is nb.best else "tied" if c in nb.tied else "    "
            print(f"  {mark} {figure(c.objective.value)} [{figure(lo)}, {figure(hi)}] "
                  f"n={c.n} {_name(c)}")  # fmt: skip
    # 1. every run's best in every other run's answer
    for (i, a), (j, b) in itertools.permutations(enumerate(runs, 1), 2):
        answer = {b["nb"].best.key, *(c.key for c in b["nb"].tied)}
        if a["nb"].best.key not in answer:
            ok = False
            print(f"FAIL: run {i}'s best ({_name(a['nb'].best)}) is not in run {j}'s answer")
    # 2. no separation contradicted by another run's order
    for (i, a), (j, b) in itertools.permutations(enumerate(runs, 1), 2):
        for x, y in itertools.permutations(a["ranking"].values(), 2):
            if x.objective.bounds[0] <= y.objective.bounds[1]:
                continue  # run i does not separate x above y
            bx, by = b["ranking"].get(x.key), b["ranking"].get(y.key)
            if bx is not None and by is not None and bx.objective.value < by.objective.value:
                ok = False
                print(f"FAIL: run {i} separates {_name(x)} above {_name(y)}; run {j} measured "
                      "them the other way round")  # fmt: skip
    print("every run's best is in every other run's answer; no separation contradicted"
          if ok else "the runs disagree")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
