"""docs/BENCHMARKS.md stays traceable: every section with figures says where they come from
(a ``Traced:`` line naming result files in docs/results/ or a test, or saying "not
reproduced"), every file it names exists, and the CPU-reproducible tables of section 3 (the
agents on the measured table, ``dse bench``) are re-derived from their printed commands."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

DOC = REPO / "docs" / "BENCHMARKS.md"
HEADING = re.compile(r"^(#{2,3}) (.+)$", re.M)
TRACED = re.compile(r"^Traced: (.+?)(?=\n\n|\n#|\Z)", re.M | re.S)
#: A path a ``Traced:`` line names (backticked or not): docs/..., tests/..., examples/...
TRACED_PATH = re.compile(r"(?<![\w/.])((?:docs|tests|examples)/[\w./*\-]*[\w*])")
#: One agent row of a ``dse bench`` table (the columns of dse.cli.bench.format_report).
ROW = re.compile(
    r"^(?P<agent>[a-z0-9_]+)\s+(?P<median>\S+)\s+(?P<reached>\d+)%\s+(?P<pct>\S+)\s+"
    r"(?P<oom>\d+)\s+(?P<oom2>\d+)\s+(?P<rejected>\d+)\s+(?P<saved>\d+)\s+(?P<secs>[\d.]+)"
    r"\s+(?P<per>[-\d ]+)$",
    re.M,
)
#: The header line of a ``dse bench`` table.
HEADER = re.compile(
    r"(?P<n_valid>\d+) valid configurations, best (?P<metric>\w+) (?P<best>[\d.]+), "
    r"target [<>]= [\d.]+ \(gap (?P<gap>[\d.]+)%\), (?P<seeds>\d+) seeds, budget "
    r"(?P<budget>\d+) trials, prescreen (?P<prescreen>on|off), prior (?P<prior>on|off)"
    r"(?: \(speed estimate (?P<estimate>on|off)\))?, memory hint (?P<hint>on|off)"
)


@dataclass(frozen=True)
class Section:
    title: str
    body: str  # its own text, up to the next heading of level 2 or 3


def sections(text: str) -> list[Section]:
    marks = list(HEADING.finditer(text))
    return [
        Section(m.group(2), text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else None])
        for i, m in enumerate(marks)
    ]


def has_figures(body: str) -> bool:
    """Prose, tables or output with a number in them (a heading-only section has none)."""
    return re.search(r"\d", body) is not None


def problems(text: str, root: Path) -> list[str]:
    """What makes the document untraceable: a section with figures and no ``Traced:`` line,
    a ``Traced:`` line with neither a file nor "not reproduced", a file that is not there."""
    out = []
    for sec in sections(text):
        if not has_figures(sec.body):
            continue
        lines = TRACED.findall(sec.body)
        if not lines:
            out.append(f"section {sec.title!r}: figures without a 'Traced:' line")
        for line in lines:
            paths = TRACED_PATH.findall(line)
            if not paths and "not reproduced" not in line:
                out.append(
                    f"section {sec.title!r}: 'Traced:' names no result file or test and does "
                    f"not say 'not reproduced': {' '.join(line.split())[:120]}"
                )
            for p in paths:
                if not any(root.glob(p)):
                    out.append(f"section {sec.title!r}: {p} does not exist")
    return out


def test_every_section_with_figures_is_traced() -> None:
    found = problems(DOC.read_text(), REPO)
    assert not found, "docs/BENCHMARKS.md:\n" + "\n".join(found)


def test_the_trace_check_catches_what_it_must(tmp_path: Path) -> None:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "a.json").write_text("{}")
    ok = (
        "# B\n\n## 1. One\n\n42 trials.\n\nTraced: `docs/results/a.json`.\n\n"
        "## 2. Two\n\n7 s.\n\nTraced: not reproduced (printed, not stored).\n\n"
        "## 3. Intro only\n\nNo figure here.\n\n### 3a\n\n1.5x\n\nTraced: `docs/results/*.json`\n"
    )
    assert problems(ok, tmp_path) == []
    bad = "## 1. One\n\n42 trials.\n\n## 2. Two\n\n7 s.\n\nTraced: `docs/results/b.json`\n"
    found = problems(bad, tmp_path)
    assert found == [
        "section '1. One': figures without a 'Traced:' line",
        "section '2. Two': docs/results/b.json does not exist",
    ]
    bare = "## 1. One\n\n42 trials.\n\nTraced: docs/results/a.json (printed by it).\n"
    assert problems(bare, tmp_path) == []  # a path without backticks counts too
    vague = "## 1. One\n\n42 trials.\n\nTraced: somewhere.\n"
    assert "names no result file" in problems(vague, tmp_path)[0]


# --- section 3: the tables re-derived from their commands ----------------------------------


def bench_tables(body: str) -> list[tuple[str, str]]:
    """(command, printed table) pairs: an indented ``dse bench`` line and the fenced block
    after it."""
    pat = re.compile(r"^    (dse bench [^\n]+)\n\n```\n(.*?)\n```", re.M | re.S)
    return [(m.group(1), m.group(2)) for m in pat.finditer(body)]


def parse_table(table: str) -> dict[str, Any]:
    head = HEADER.search(table)
    assert head, f"no dse bench header line in:\n{table}"
    rows = {m.group("agent"): m.groupdict() for m in ROW.finditer(table)}
    assert rows, f"no agent rows in:\n{table}"
    return {"header": head.groupdict(), "rows": rows}


def _num(s: str) -> float | None:
    return None if s == "-" else float(s)


def compare(doc: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """Where the printed table and the command's ``--json`` report differ (all but time)."""
    out = []
    h = doc["header"]
    want = {
        "n_valid": int(h["n_valid"]),
        "metric": h["metric"],
        "best": float(h["best"]),
        "gap": float(h["gap"]) / 100,
        "seeds": int(h["seeds"]),
        "budget": int(h["budget"]),
        "prescreen": h["prescreen"] == "on",
        "prior": h["prior"] == "on",
        "hint": h["hint"] == "on",
    }
    got = {
        "n_valid": report["n_valid"],
        "metric": report["metric"],
        "best": float(f"{report['best_value']:g}"),
        "gap": round(report["target_gap"], 4),
        "seeds": report["seeds"],
        "budget": report["budget"],
        "prescreen": report["prescreen"],
        "prior": report["prior"],
        "hint": report["memory_hint"],
    }
    if h["estimate"] is not None:
        want["estimate"], got["estimate"] = h["estimate"] == "on", report["estimate"]
    out += [f"header {k}: printed {want[k]}, now {got[k]}" for k in want if want[k] != got[k]]
    if sorted(doc["rows"]) != sorted(report["agents"]):
        out.append(f"agents: printed {sorted(doc['rows'])}, now {sorted(report['agents'])}")
    for name, row in doc["rows"].items():
        a = report["agents"].get(name)
        if a is None:
            continue
        per = [None if t == "-" else int(t) for t in row["per"].split()]
        pairs = {
            "median": (_num(row["median"]), a["median_trials_to_target"]),
            "reached": (int(row["reached"]), round(100 * a["reached_fraction"])),
            "OOM run": (int(row["oom"]), a["oom_trials_run"]),
            "OOM 2nd+": (int(row["oom2"]), a["oom_after_first_oom"]),
            "rejected": (int(row["rejected"]), a["rule_rejections"] + a["prescreen_rejections"]),
            "saved": (int(row["saved"]), a["prescreen_saved"]),
            "per seed": (per, a["trials_to_target"]),
        }
        out += [f"{name} {k}: printed {p}, now {n}" for k, (p, n) in pairs.items() if p != n]
    return out


def _section_3() -> str:
    for sec in sections(DOC.read_text()):
        if sec.title.startswith("3. "):
            return sec.body
    raise AssertionError("docs/BENCHMARKS.md has no section 3")


SECTION_3 = bench_tables(_section_3())


def test_section_3_has_its_tables() -> None:
    assert len(SECTION_3) >= 3, [c for c, _ in SECTION_3]
    flags = [set(shlex.split(c)) for c, _ in SECTION_3]
    assert any("--no-prior" in f and "--no-estimate" in f for f in flags)


@pytest.fixture(scope="module")
def section_3_reports() -> dict[str, dict[str, Any]]:
    """Each section-3 command run as printed (with ``--json``), all at once (they are
    independent; on a 2-core CI machine this halves the wall time): command -> report."""
    procs = {}
    for command, _ in SECTION_3:
        argv = shlex.split(command)
        assert argv[:2] == ["dse", "bench"], command
        procs[command] = subprocess.Popen(
            [sys.executable, "-c", "import sys; from dse.cli.main import main; sys.exit(main())",
             *argv[1:], "--json"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    out = {}
    for command, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"`{command}` exited {proc.returncode}: {stderr[-3000:]}"
        out[command] = json.loads(stdout)
    return out


def _flags(command: str) -> str:
    """A test id: the command's switches past its table, agents and seeds."""
    argv = shlex.split(command)
    return " ".join(a for a in argv if a.startswith("--") and a not in
                    ("--table", "--agents", "--seeds")) or "as-is"  # fmt: skip


@pytest.mark.parametrize("command,table", SECTION_3, ids=[_flags(c) for c, _ in SECTION_3])
def test_section_3_table_is_what_its_command_prints(
    command: str, table: str, section_3_reports: dict[str, dict[str, Any]]
) -> None:
    """The printed table against what its command prints now: every column but the time."""
    diff = compare(parse_table(table), section_3_reports[command])
    assert not diff, f"section 3, `{command}`:\n" + "\n".join(diff)


def test_compare_names_a_changed_figure() -> None:
    """The comparison is not vacuous: a table that differs from the report in one seed or
    one header field is named."""
    command, table = SECTION_3[0]
    parsed = parse_table(table)
    report: dict[str, Any] = {
        "n_valid": int(parsed["header"]["n_valid"]),
        "metric": parsed["header"]["metric"],
        "best_value": float(parsed["header"]["best"]),
        "target_gap": float(parsed["header"]["gap"]) / 100,
        "seeds": int(parsed["header"]["seeds"]),
        "budget": int(parsed["header"]["budget"]),
        "prescreen": parsed["header"]["prescreen"] == "on",
        "prior": parsed["header"]["prior"] == "on",
        "memory_hint": parsed["header"]["hint"] == "on",
        "estimate": True,
        "agents": {
            name: {
                "median_trials_to_target": _num(row["median"]),
                "reached_fraction": int(row["reached"]) / 100,
                "oom_trials_run": int(row["oom"]),
                "oom_after_first_oom": int(row["oom2"]),
                "rule_rejections": int(row["rejected"]),
                "prescreen_rejections": 0,
                "prescreen_saved": int(row["saved"]),
                "trials_to_target": [None if t == "-" else int(t) for t in row["per"].split()],
            }
            for name, row in parsed["rows"].items()
        },
    }
    assert compare(parsed, report) == []
    report["agents"]["tpe"]["trials_to_target"][3] += 1
    report["n_valid"] += 1
    diff = compare(parsed, report)
    assert any(d.startswith("tpe per seed") for d in diff), diff
    assert any(d.startswith("header n_valid") for d in diff), diff


def test_section_3_result_files_hold_the_printed_tables() -> None:
    """The result files the section names are the ``--json`` output of its commands."""
    files = {
        "": "bench_shared_prior.json",
        "--no-prior": "bench_shared_no_prior.json",
        "--no-prior --no-estimate": "bench_shared_no_prior_no_estimate.json",
    }
    for command, table in SECTION_3:
        extra = " ".join(a for a in shlex.split(command) if a in ("--no-prior", "--no-estimate"))
        report = json.loads((REPO / "docs" / "results" / files[extra]).read_text())
        diff = compare(parse_table(table), report)
        assert not diff, f"{files[extra]} vs `{command}`:\n" + "\n".join(diff)
