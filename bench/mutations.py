"""Domain mutations against the tests that claim to catch them (issue 40).

Each mutation is one exact text edit of one source file: a formula loses a factor, a rule loses
one half, the best's tie-break flips, the knob catalog gains a knob for a field Megatron-Core
constrains with no rule for it. For each, the checkout is copied to a temporary folder, the
edit is applied there (it must match exactly once, so a drifted mutation is an error, never a
silent no-op), the named tests are run in the copy, and the mutation is reported **killed**
(some test failed, named) or **survived** (all passed). The checkout itself is never edited.
An unmutated run of the same tests comes first and must pass.

    python bench/mutations.py                # every mutation
    python bench/mutations.py M4 M6          # some of them
    python bench/mutations.py --tests-at REV  # the same, with the tests of commit REV

``--tests-at REV`` replaces the copy's ``tests/`` by that commit's (the source stays this
checkout's): what the tests of an earlier commit caught. A test file that commit lacks is left
out; a mutation with none of its test files left survives ("no test").
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    key: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


_FLOPS = ("tests/model/test_flops.py",)
_RULES = ("tests/model/test_rules.py", "tests/model/test_rule_sources.py")
_BEST = ("tests/results/test_noise.py", "tests/results/test_one_best.py")
_KNOBS = ("tests/model/test_rule_sources.py", "tests/space/test_knob_facts.py")

_EXTRA_KNOB = """        Knob(
            "defer_embedding_wgrad_compute",
            "bool",
            False,
            "Defer the embedding's weight-gradient GEMMs to the pipeline flush.",
            _one("model", "defer_embedding_wgrad_compute"),
        ),
    ]
    ks += _hybrid_moe_knobs()"""

MUTATIONS = (
    Mutation("M3", "dense/MoE FLOPs: drop the shared expert", "dse/model/flops.py",
             "(moe_ffn * topk + shared_ffn) * moe_layers", "(moe_ffn * topk) * moe_layers",
             _FLOPS),
    Mutation("M4", "hybrid (Mamba) FLOPs: drop the causal halving of attention",
             "dse/model/flops.py", "+ 2 * t * seq * q  #", "+ 4 * t * seq * q  #", _FLOPS),
    Mutation("M4b", "dense FLOPs: drop the causal halving of attention", "dse/model/flops.py",
             "2 * q_size * seq * 0.5 * layers", "2 * q_size * seq * layers", _FLOPS),
    Mutation("M4c", "MoE FLOPs: count one routed expert, not topk", "dse/model/flops.py",
             "(moe_ffn * topk + shared_ffn) * moe_layers", "(moe_ffn + shared_ffn) * moe_layers",
             _FLOPS),
    Mutation("M5", "rule overlap_param_gather: drop the overlap_grad_reduce half",
             "dse/model/rules.py",
             '_get(fp, "use_distributed_optimizer") and _get(fp, "overlap_grad_reduce")',
             '_get(fp, "use_distributed_optimizer")', _RULES),
    Mutation("M5b", "rule overlap_param_gather: drop the distributed-optimizer half",
             "dse/model/rules.py",
             '_get(fp, "use_distributed_optimizer") and _get(fp, "overlap_grad_reduce")',
             '_get(fp, "overlap_grad_reduce")', _RULES),
    Mutation("M6", "best: flip the tie-break (docstring: ties go to the lower trial number)",
             "dse/results/noise.py", 'c.study or "", c.number))', 'c.study or "", -c.number))',
             _BEST),
    Mutation("M8", "catalog: a knob for a field Megatron-Core constrains, without a rule",
             "dse/space/knobs.py", "    ]\n    ks += _hybrid_moe_knobs()", _EXTRA_KNOB, _KNOBS),
)  # fmt: skip

_IGNORE = shutil.ignore_patterns(".git", "__pycache__", ".venv", "*.db", ".mypy_cache", "htmlcov")


def _copy(tests_at: str | None) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="dse-mut-"))
    for name in ("dse", "tests", "examples", "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp / name, ignore=_IGNORE)
        else:
            shutil.copy2(src, tmp / name)
    if tests_at:
        shutil.rmtree(tmp / "tests")
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", tests_at, "tests"],
                                 capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp


def _present(tree: Path, tests: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(t for t in tests if (tree / t).exists())


def _apply(tree: Path, m: Mutation) -> None:
    path = tree / m.path
    text = path.read_text()
    n = text.count(m.old)
    if n != 1:
        raise SystemExit(f"{m.key}: {m.path} has {n} matches of {m.old!r} (want exactly 1)")
    path.write_text(text.replace(m.old, m.new))


def _pytest(tree: Path, tests: tuple[str, ...]) -> tuple[int, list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf",
           "--no-cov", *tests]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    summary = next((ln for ln in reversed(out.splitlines()) if " in " in ln), "")
    return proc.returncode, failed, summary.strip("= ")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keys", nargs="*", help="mutations to run (default: all)")
    ap.add_argument("--tests-at", metavar="REV", help="run the tests of commit REV")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.keys or m.key in args.keys]
    unknown = sorted(set(args.keys) - {m.key for m in MUTATIONS})
    if unknown:
        ap.error(f"unknown mutations {unknown}; known: {[m.key for m in MUTATIONS]}")
    tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
    clean = _copy(args.tests_at)
    try:
        rc, failed, summary = _pytest(clean, _present(clean, tests))
        print(f"unmutated: {summary}")
        if rc != 0:
            print(f"the unmutated tests fail ({failed}); no mutation judged")
            return 2
    finally:
        shutil.rmtree(clean, ignore_errors=True)
    survived = 0
    for m in chosen:
        tree = _copy(args.tests_at)
        try:
            _apply(tree, m)
            present = _present(tree, m.tests)
            rc, failed, summary = _pytest(tree, present) if present else (0, [], "no test")
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        verdict = "killed" if rc != 0 else "SURVIVED"
        survived += rc == 0
        print(f"{m.key:4} {verdict:8} {m.what}")
        print(f"     {m.path}: {m.old!r} -> {m.new.splitlines()[0]!r}...")
        print(f"     {' '.join(m.tests)}: {summary}")
        for f in failed:
            print(f"     failed: {f}")
    print(f"{len(chosen) - survived} of {len(chosen)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
