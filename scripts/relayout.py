"""Re-lay the source and test trees so that each folder's name says its job (issue 40): moves
and renames only, re-runnable.

``python scripts/relayout.py`` (from the checkout's root; ``--dry-run`` prints what it would
do). It

1. moves the modules of :data:`MODULE_MOVES` with ``git mv`` (a package: every tracked file
   under it, so files a branch added since are moved too), the test files of
   :data:`TEST_FILE_MOVES` and the test folders of :data:`TEST_DIR_MOVES`; a test file of
   ``tests/dse/`` or of ``tests/`` itself that the table does not name goes to the folder of
   the dse package it imports most (one of ``tests/`` that imports none: to ``tests/project/``;
   printed, to be checked, and its references rewritten like the table's);
2. rewrites every reference to a moved module or test (dotted ``dse.core.measure``, a path
   ``dse/core/measure.py``, ``from dse.core import measure``) and the renamed names of
   :data:`SYMBOL_RENAMES` with exact regular expressions over the tracked text files of
   :data:`REWRITE_ROOTS` (recorded outputs under ``docs/results/`` are left as they were run),
   and a relative reference (``:mod:`._export```, ``from .launcher import``) in a module left
   in a moved module's old folder;
   a test file moved one folder deeper gets its ``Path(__file__)...parents[k]`` one higher;
3. edits the import contracts of ``pyproject.toml``: a moved module leaves its old folder's
   contract and joins its new folder's (:data:`NEW_CONTRACTS` for a folder that had none),
   and every list of folders that names ``dse.workloads`` names ``dse.runners`` too.

Each step checks before it acts, so a second run changes nothing, and a run on a checkout that
gained files or imports of the old paths since moves and rewrites those too. What it cannot
do safely (an import list mixing a moved module with others, a contract line it does not
recognise) stops it with the file and the line to fix by hand.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: dse modules (a module or a package) moved or renamed: old dotted path -> new dotted path.
MODULE_MOVES: dict[str, str] = {
    # statistics and numerics: a folder of their own between the vocabulary and the space
    "dse.core.measure": "dse.stats.measure",
    "dse.core.numerics": "dse.stats.numerics",
    "dse.core.table": "dse.stats.table",
    # the controller's side of a trial: its own folder, above the trial processes
    "dse.workloads.runners": "dse.runners",
    # one word per concept: "export" is another tool's format (dse.interop), "launcher" a
    # recipe launcher (dse.workloads.launchers); the others say what they do
    "dse.results.export": "dse.results.best_formats",
    "dse.storage._export": "dse.storage._study_file",
    "dse.loop.launcher": "dse.loop.dispatch",
    "dse.api.launch": "dse.api.spawn",
}

_SPAWNER_FILES = ("dse/api/deps.py", "dse/api/routes/studies.py", "tests/api/test_write.py")
#: Names renamed with their module (whole words; (path prefixes where, old, new)).
SYMBOL_RENAMES: list[tuple[tuple[str, ...], str, str]] = [
    (("dse/", "tests/", "bench/", "scripts/", "docs/"), "TrialLauncher", "TrialDispatcher"),
    (("dse/loop/", "tests/loop/", "tests/study/"), r"self\.launcher", "self.dispatcher"),
    (("dse/api/", "tests/api/"), "SubprocessLauncher", "SubprocessSpawner"),
    (("dse/api/", "tests/api/"), "LauncherDep", "SpawnerDep"),
    (("dse/api/", "tests/api/"), "get_launcher", "get_spawner"),
    (("dse/api/", "tests/api/"), r"state\.launcher", "state.spawner"),
    (("dse/api/", "tests/api/"), "Launcher", "Spawner"),
    (("dse/api/", "tests/api/"), "Launched", "Spawned"),
    (("tests/api/test_write.py",), "RecordingLauncher", "RecordingSpawner"),
    # the spawner's own variables (elsewhere in dse.api a "launcher" is a recipe's)
    (_SPAWNER_FILES, "launcher", "spawner"),
    (_SPAWNER_FILES, "launched", "spawned"),
    (("dse/loop/", "tests/loop/", "tests/study/"), "trial launcher", "trial dispatcher"),
]

#: Test folders moved whole (their conftest and data with them).
TEST_DIR_MOVES: dict[str, str] = {
    "tests/study": "tests/loop",
    "tests/costmodel": "tests/model/costmodel",
}

_CORE = ("test_envpolicy", "test_expr", "test_figures", "test_names", "test_registry",
         "test_safeyaml", "test_trial_contract")  # fmt: skip
_STATS = ("test_adaptive_replay", "test_measure", "test_numerics", "test_table",
          "test_window_vs_long")  # fmt: skip
_SPACE = ("test_bridge_recipe_defaults", "test_derive", "test_derive_module", "test_fuzz_space",
          "test_hostile_space", "test_hybrid", "test_knob_facts", "test_knobs",
          "test_layer_patterns", "test_layout", "test_space", "test_space_hints")  # fmt: skip
_MODEL = ("space_check_targets", "test_flops", "test_mla", "test_rule_sources", "test_rules",
          "test_space_check")  # fmt: skip
_RESULTS = ("test_gpu_usage", "test_noise", "test_noise_decisions",
            "test_noise_headline_runs", "test_objective", "test_one_best")  # fmt: skip
_INTEROP = ("test_cloudai", "test_cloudai_recipe_pick", "test_optuna_export")
_REPORT = ("test_report", "test_report_cpu_clock", "test_report_many_knobs",
           "test_studyplots_views")  # fmt: skip

#: Tests of dse.runners that lived with the workloads'.
_RUNNERS = ("test_compile_cache", "test_runner_contract", "test_warm_settings",
            "test_warm_worker_memory", "test_warm_workers")  # fmt: skip

#: Single test files moved: old path -> new path. tests/<folder>/ holds the tests of
#: dse/<folder>/; tests/project/ (the repository's own checks: docs, packaging, contracts,
#: the tree) and tests/bench/ (the bench/ scripts) are the cross-cutting folders.
TEST_FILE_MOVES: dict[str, str] = {
    **{f"tests/dse/{n}.py": f"tests/core/{n}.py" for n in _CORE},
    **{f"tests/dse/{n}.py": f"tests/stats/{n}.py" for n in _STATS},
    **{f"tests/dse/{n}.py": f"tests/space/{n}.py" for n in _SPACE},
    **{f"tests/dse/{n}.py": f"tests/model/{n}.py" for n in _MODEL},
    **{f"tests/dse/{n}.py": f"tests/results/{n}.py" for n in _RESULTS},
    **{f"tests/dse/{n}.py": f"tests/interop/{n}.py" for n in _INTEROP},
    **{f"tests/dse/{n}.py": f"tests/report/{n}.py" for n in _REPORT},
    **{f"tests/workloads/{n}.py": f"tests/runners/{n}.py" for n in _RUNNERS},
    "tests/dse/test_export.py": "tests/results/test_best_formats.py",
    "tests/dse/test_agent_session.py": "tests/loop/test_agent_session.py",
    "tests/dse/test_estimate_rank_bench.py": "tests/bench/test_estimate_rank_bench.py",
    "tests/dse/test_host_jitter_bench.py": "tests/bench/test_host_jitter_bench.py",
    "tests/test_proposer.py": "tests/loop/test_proposer.py",
    "tests/test_bench.py": "tests/cli/test_bench.py",
    "tests/test_gpu_bench_parts.py": "tests/bench/test_gpu_bench_parts.py",
    "tests/test_gpu_study_script.py": "tests/bench/test_gpu_study_script.py",
    "tests/test_benchmarks_trace.py": "tests/project/test_benchmarks_trace.py",
    "tests/test_docs.py": "tests/project/test_docs.py",
    "tests/test_import_contracts.py": "tests/project/test_import_contracts.py",
    "tests/test_packaging.py": "tests/project/test_packaging.py",
    "tests/test_readme_usage.py": "tests/project/test_readme_usage.py",
}

#: Where references are rewritten: tracked files under these (a folder) or these files.
REWRITE_ROOTS = ("dse/", "tests/", "bench/", "scripts/", "docs/", "examples/", "docker/",
                 "README.md",
                 "pyproject.toml")  # fmt: skip
#: Left as they are: recorded outputs (what was run then), binary data, this script.
REWRITE_SKIP = ("docs/results/", "scripts/relayout.py")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".sh", ".cfg", ".ini", ".json",
                 ".jsonl", ".html", ".js", ".css", ".mako", ".rst", ""}  # fmt: skip

#: Contracts of folders that have none before the move (inserted after the named contract).
NEW_CONTRACTS: dict[str, tuple[str, str]] = {
    "dse.runners": (
        "dse.workloads:",
        "[[tool.importlinter.contracts]]\n"
        'name = "dse.runners: the runner factory > each runner > what they share"\n'
        'type = "layers"\n'
        'containers = ["dse.runners"]\n'
        "exhaustive = true\n"
        'layers = ["_registry", "local | ray_runner | slurm_runner | inprocess", '
        '"warm | _cluster", "_base"]\n',
    ),
}
#: Contract names that named what moved out of them.
CONTRACT_RENAMES = {
    "dse.workloads: trainer | runners > launchers > shared parts":
        "dse.workloads: trial processes > recipe launchers > shared parts",
}  # fmt: skip


def say(line: str) -> None:
    sys.stdout.write(line + "\n")


class RelayoutError(Exception):
    """Something the script cannot do safely; the message names the file and the line."""


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def tracked(prefix: str) -> list[str]:
    return [p for p in git("ls-files", "--", prefix).splitlines() if p]


def module_path(dotted: str) -> tuple[str, bool]:
    """(path, is_package) of a dotted module as it is on disk now, or ("", False)."""
    base = dotted.replace(".", "/")
    if (ROOT / base / "__init__.py").exists():
        return base, True
    if (ROOT / f"{base}.py").exists():
        return f"{base}.py", False
    return "", False


# ---------------------------------------------------------------------------- moves


def plan_moves() -> list[tuple[str, str]]:
    """Every (old, new) file move still to do, in order."""
    moves: list[tuple[str, str]] = []
    for old, new in MODULE_MOVES.items():
        path, package = module_path(old)
        if not path:
            continue  # moved already
        if package:
            dest = new.replace(".", "/")
            moves += [(f, dest + f[len(path) :]) for f in tracked(path + "/")]
        else:
            moves.append((path, new.replace(".", "/") + ".py"))
    for old, new in TEST_DIR_MOVES.items():
        moves += [(f, new + f[len(old) :]) for f in tracked(old + "/")]
    for old, new in TEST_FILE_MOVES.items():
        if (ROOT / old).exists():
            moves.append((old, new))
    named = set(TEST_FILE_MOVES)
    GUESSED.clear()
    for f in tracked("tests/dse/"):
        if f in named:
            continue
        if f.count("/") != 2:
            raise RelayoutError(
                f"{f}: a folder inside tests/dse/; name the place of its files in "
                "TEST_FILE_MOVES or TEST_DIR_MOVES, then run again"
            )
        if Path(f).name == "conftest.py":
            raise RelayoutError(
                f"{f}: its fixtures are shared by tests that go to several folders; move them "
                "into tests/conftest.py by hand, then run again"
            )
        if Path(f).name == "__init__.py":
            continue
        GUESSED[f] = f"tests/{guess_folder(f)}/{Path(f).name}"
    # a test a branch added beside the cross-cutting ones: to its folder, or to tests/project/
    for f in tracked("tests/"):
        name = Path(f).name
        if f.count("/") == 1 and name.startswith("test_") and name.endswith(".py"):
            if f not in named:
                GUESSED[f] = f"tests/{guess_folder(f, 'project')}/{name}"
    for f, new in GUESSED.items():
        say(f"  {f}: not in TEST_FILE_MOVES; by the dse folder it imports most -> {new}")
        moves.append((f, new))
    taken: dict[str, str] = {}
    for old, new in moves:
        if new in taken or ((ROOT / new).exists() and new != old):
            raise RelayoutError(
                f"{old}: its new place {new} is taken (by {taken.get(new, 'a tracked file')}); "
                "name another in TEST_FILE_MOVES, then run again"
            )
        taken[new] = old
    return moves


#: Test files placed by :func:`guess_folder` in this run (old path -> new path); their
#: references are rewritten like those of :data:`TEST_FILE_MOVES`.
GUESSED: dict[str, str] = {}


def guess_folder(test_file: str, otherwise: str | None = None) -> str:
    """The top folder of dse a test file imports most (after the module moves); ``otherwise``
    for one that imports none (None: an error)."""
    text = rewrite_text((ROOT / test_file).read_text(), test_file)
    found = re.findall(r"(?<![\w.])dse\.([a-z_]+)", text)
    folders = [f for f in found if (ROOT / "dse" / f).is_dir() or f in NEW_TOP_FOLDERS]
    if not folders and otherwise:
        return otherwise
    if not folders:
        raise RelayoutError(
            f"{test_file}: imports no dse folder; name its place in TEST_FILE_MOVES"
        )
    return Counter(folders).most_common(1)[0][0]


NEW_TOP_FOLDERS = {new.split(".")[1] for new in MODULE_MOVES.values()}


def depth_delta(old: str, new: str) -> int:
    return new.count("/") - old.count("/")


def move(old: str, new: str, dry: bool) -> None:
    say(f"  git mv {old} {new}")
    if dry:
        return
    (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
    git("mv", old, new)
    delta = depth_delta(old, new)
    if delta and old.startswith("tests/") and new.endswith(".py"):
        p = ROOT / new
        text = p.read_text()
        text = re.sub(
            r"(Path\(__file__\)(?:\.resolve\(\))?\.parents\[)(\d+)(\])",
            lambda m: f"{m[1]}{int(m[2]) + delta}{m[3]}",
            text,
        )
        if not any(old.startswith(d + "/") for d in TEST_DIR_MOVES):
            # a file moved alone: ``.parent`` (its folder) was tests/ itself
            text = re.sub(
                r"(Path\(__file__\)(?:\.resolve\(\))?)\.parent\b(?!s)",
                lambda m: f"{m[1]}.parents[{delta}]",
                text,
            )
        p.write_text(text)


def clean_empty(dirs: set[Path]) -> None:
    """Remove folders the moves left with nothing tracked (their caches included)."""
    for d in sorted(dirs, key=lambda p: -len(p.parts)):
        while d != ROOT and d.exists() and not tracked(str(d.relative_to(ROOT)) + "/"):
            shutil.rmtree(d)
            d = d.parent


# ------------------------------------------------------------------------ rewrites


def _dotted(old: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w.])" + re.escape(old) + r"(?!\w)")


def _slashed(old: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w./-])" + re.escape(old) + r"(?![\w-])")


def _rules() -> list[tuple[re.Pattern[str], str]]:
    rules: list[tuple[re.Pattern[str], str]] = []
    for old, new in MODULE_MOVES.items():
        rules.append((_dotted(old), new))
        o, n = old.replace(".", "/"), new.replace(".", "/")
        rules.append((re.compile(r"(?<![\w./-])" + re.escape(o) + r"(?=\.py\b|/|[^\w./-]|$)"), n))
        parent, _, name = old.rpartition(".")
        nparent, _, nname = new.rpartition(".")
        rules.append(
            (
                re.compile(
                    rf"^(\s*from\s+){re.escape(parent)}(\s+import\s+){name}\b(?=\s*(?:as\s+\w+\s*)?$)",
                    re.M,
                ),
                rf"\g<1>{nparent}\g<2>{nname}" + ("" if nname == name else f" as {name}"),
            )
        )
    for old, new in TEST_DIR_MOVES.items():
        rules.append((re.compile(r"(?<![\w./-])" + re.escape(old) + r"(?=/)"), new))
        rules.append((_dotted(old.replace("/", ".")), new.replace("/", ".")))
    for old, new in {**TEST_FILE_MOVES, **GUESSED}.items():
        rules.append((_slashed(old), new))
        rules.append((_dotted(old[: -len(".py")].replace("/", ".")), new[:-3].replace("/", ".")))
    return rules


RULES: list[tuple[re.Pattern[str], str]] = []
_RULES_FOR: list[tuple[tuple[str, str], ...]] = []  # the GUESSED moves RULES were built with
_MIXED_IMPORT: list[tuple[re.Pattern[str], str]] = []

#: A Sphinx role's relative target (``:mod:`._export```, ``:func:`~.launcher.x```) or a
#: relative import; {name} is the module's name in its folder.
_RELATIVE = (
    r"(?P<pre>:(?:mod|func|class|meth|data|attr|obj):`~?)\.{name}(?=[`.])",
    r"(?P<pre>^\s*from\s+)\.{name}(?=\s+import\b)",
)


def _relative(text: str, path: str) -> str:
    """Relative references to a moved module from a module left in its old folder: to its new
    name if it stays in that folder, else to its new dotted path."""
    folder = str(Path(path).parent).replace("/", ".")
    for old, new in MODULE_MOVES.items():
        parent, _, name = old.rpartition(".")
        if parent != folder:
            continue
        nparent, _, nname = new.rpartition(".")
        target = f".{nname}" if nparent == parent else new
        for pat in _RELATIVE:
            text = re.sub(pat.format(name=re.escape(name)), rf"\g<pre>{target}", text, flags=re.M)
        text = re.sub(
            rf"^(\s*)from\s+\.\s+import\s+{re.escape(name)}\s*$",
            rf"\g<1>from {nparent} import {nname}" + ("" if nname == name else f" as {name}"),
            text,
            flags=re.M,
        )
    return text


def _mixed() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for old in MODULE_MOVES:
        parent, _, name = old.rpartition(".")
        out.append(
            (re.compile(rf"^\s*from\s+{re.escape(parent)}\s+import\s+.*\b{name}\b.*$", re.M), old)
        )
    return out


def rewrite_text(text: str, path: str) -> str:
    key = tuple(sorted(GUESSED.items()))
    if not RULES or _RULES_FOR != [key]:
        RULES[:] = _rules()
        _RULES_FOR[:] = [key]
        _MIXED_IMPORT[:] = _mixed()
    for pat, repl in RULES:
        text = pat.sub(repl, text)
    if path.endswith(".py"):
        text = _relative(text, path)
        for pat, old in _MIXED_IMPORT:
            for m in pat.finditer(text):
                raise RelayoutError(
                    f"{path}: `{m[0].strip()}` imports {old} among other names; "
                    "split that import by hand, then run again"
                )
    for prefixes, old, new in SYMBOL_RENAMES:
        if path.endswith(".py") and path.startswith(prefixes):
            text = re.sub(rf"(?<![\w]){old}(?!\w)", new, text)
    return text


def rewrite_files(dry: bool) -> list[str]:
    changed = []
    files = [f for r in REWRITE_ROOTS for f in tracked(r)]
    for f in files:
        if f.startswith(REWRITE_SKIP) or Path(f).suffix not in TEXT_SUFFIXES:
            continue
        p = ROOT / f
        if not p.is_file():
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite_text(text, f)
        if f == "pyproject.toml":
            new = edit_contracts(new)
        if new != text:
            changed.append(f)
            if not dry:
                p.write_text(new)
    return changed


# ------------------------------------------------------------------------ contracts


def _blocks(text: str) -> list[str]:
    """pyproject.toml cut before each ``[[tool.importlinter.contracts]]``."""
    return re.split(r"(?m)^(?=\[\[tool\.importlinter\.contracts\]\])", text)


def _container(block: str) -> str | None:
    m = re.search(r'(?m)^containers = \["([\w.]+)"\]', block)
    return m[1] if m else None


def _edit_layers(block: str, fn: object) -> str:
    m = re.search(r"(?ms)^layers = \[(.*?)\]\n", block)
    if m is None:
        raise RelayoutError(f"pyproject.toml: no layers in the contract {block.splitlines()[1]}")
    layers = re.findall(r'"([^"]*)"', m[1])
    new_layers = fn(layers)  # type: ignore[operator]
    if new_layers == layers:
        return block
    body = ", ".join(f'"{x}"' for x in new_layers)
    line = f"layers = [{body}]\n"
    if len(line) > 100:
        line = "layers = [\n" + "".join(f'    "{x}",\n' for x in new_layers) + "]\n"
    return block[: m.start()] + line + block[m.end() :]


def _tokens(layer: str) -> list[str]:
    return [t.strip() for t in layer.split("|")]


def edit_contracts(text: str) -> str:
    blocks = _blocks(text)
    for old, new in MODULE_MOVES.items():
        oc, _, oname = old.rpartition(".")
        nc, _, nname = new.rpartition(".")
        for i, b in enumerate(blocks):
            c = _container(b)
            if c == oc and oc == nc:  # renamed in its folder
                blocks[i] = _edit_layers(
                    b,
                    lambda ls, o=oname, n=nname: [
                        " | ".join(n if t == o else t for t in _tokens(x)) for x in ls
                    ],
                )
            elif c == oc:  # moved out of this folder
                blocks[i] = _edit_layers(
                    b,
                    lambda ls, o=oname: [
                        y for x in ls if (y := " | ".join(t for t in _tokens(x) if t != o))
                    ],
                )
            elif c == nc and oc != nc:  # moved into this folder: beside its top layer
                blocks[i] = _edit_layers(
                    b,
                    lambda ls, n=nname: (
                        ls
                        if any(n in _tokens(x) for x in ls)
                        else [" | ".join([*_tokens(ls[0]), n]), *ls[1:]]
                    ),
                )
    for container, (after, contract) in NEW_CONTRACTS.items():
        if any(_container(b) == container for b in blocks):
            continue
        at = next(
            (i for i, b in enumerate(blocks) if re.search(rf'(?m)^name = "{re.escape(after)}', b)),
            None,
        )
        if at is None:
            raise RelayoutError(f'pyproject.toml: no contract named "{after}..." to follow')
        blocks.insert(at + 1, contract + "\n")
    text = "".join(blocks)
    for old, new in CONTRACT_RENAMES.items():
        text = text.replace(f'name = "{old}"', f'name = "{new}"')
    return _with_runners(text)


def _with_runners(text: str) -> str:
    """dse.runners beside dse.workloads wherever folders are listed: in the folder layers it
    takes the place of dse.workloads, which goes one layer down (the runners import it); in a
    list of modules it is added after it."""
    blocks = _blocks(text)
    for i, b in enumerate(blocks):
        if 'type = "plugin_layers"' in b:
            if "dse.runners" in b:
                continue

            def place(ls: list[str]) -> list[str]:
                out = []
                for x in ls:
                    toks = _tokens(x)
                    if "dse.workloads" in toks:
                        out.append(" | ".join("dse.runners" if t == "dse.workloads" else t
                                              for t in toks))  # fmt: skip
                        out.append("dse.workloads")
                    else:
                        out.append(x)
                return out

            blocks[i] = _edit_layers(b, place)
            continue

        def add(m: re.Match[str]) -> str:
            body = m[2]
            if '"dse.workloads"' not in body or '"dse.runners"' in body:
                return m[0]
            body = body.replace('"dse.workloads"', '"dse.workloads", "dse.runners"', 1)
            if any(len(line) > 99 for line in body.splitlines()):
                names = re.findall(r'"[^"]*"', body)
                body, line = "\n", "   "
                for n in names:
                    if len(line) + len(n) + 2 > 99:
                        body, line = body + line + "\n", "   "
                    line += f" {n},"
                body += line + "\n"
            return m[1] + body + "]"

        blocks[i] = re.sub(r"(?ms)^((?:source|forbidden)_modules = \[)(.*?)\]", add, b)
    return "".join(blocks)


# ---------------------------------------------------------------------------- main


def tidy(files: list[str]) -> None:
    """Imports sorted again and lines wrapped again (the new names sort and measure
    differently), with the repository's own ruff settings; a line still too long is named."""
    ruff = [sys.executable, "-m", "ruff"]
    subprocess.run([*ruff, "check", "--fix", "--select", "I", "-q", *files], cwd=ROOT, check=False)
    subprocess.run([*ruff, "format", "-q", *files], cwd=ROOT, check=False)
    long = subprocess.run(
        [*ruff, "check", "--select", "E501", "--output-format", "concise", "-q", *files],
        cwd=ROOT, capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if long:
        say("relayout: lines too long after the renames, to wrap by hand:\n" + long)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dry-run", action="store_true", help="print what it would do, change nothing"
    )
    args = ap.parse_args(argv)
    try:
        moves = plan_moves()
        left: set[Path] = set()
        for old, new in moves:
            move(old, new, args.dry_run)
            left.add((ROOT / old).parent)
        if not args.dry_run:
            clean_empty(left)
        changed = rewrite_files(args.dry_run)
    except RelayoutError as e:
        sys.stderr.write(f"relayout: {e}\n")
        return 1
    for f in changed:
        say(f"  rewrote {f}")
    touched = sorted({*changed, *(new for _, new in moves)})
    py = [f for f in touched if f.endswith(".py") and (ROOT / f).exists()]
    if py and not args.dry_run:
        tidy(py)
    say(f"relayout: {len(moves)} files moved, {len(changed)} files rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
