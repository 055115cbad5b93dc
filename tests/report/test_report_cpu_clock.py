"""``dse report`` of the CPU demo (issue 29): a study whose trials time each step by CPU time
(``measurement.clock: cpu``, examples/demo_cpu.yaml) says "CPU time per step (s)" with the
wall time beside it in its best section, its projection and the comparison of the model's
studies; a study timed by wall time keeps "step time (s)". Opened in headless Chromium.

``DSE_REPORT_DEMO=sqlite:///PATH`` (a finished README demo, study ``demo-cpu``): the same
checks on its report; with ``DSE_REPORT_SHOT=1`` too, the whole page goes to
docs/results/report_demo.png."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dse.cli.main import main
from dse.core.figures import figure
from dse.storage import open_storage
from tests.api.live import chromium
from tests.api.seed import seed_cpu_clock, seed_database

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
CPU, WALL = "demo-cpu-clock", "demo-wall-clock"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    u = f"sqlite:///{tmp_path_factory.mktemp('cpu-clock') / 'clock.db'}"

    def fill(st: object) -> None:
        seed_cpu_clock(st, CPU)  # type: ignore[arg-type]
        seed_cpu_clock(st, WALL, clock="wall")  # type: ignore[arg-type]

    seed_database(u, fill)
    return u


def _report(url: str, study: str, out: Path) -> dict:
    assert main(["report", "--storage", url, "--study", study, "-o", str(out)]) == 0
    return json.loads((out / "report.json").read_text())


def _rows(page: object) -> dict[str, tuple[str, str]]:
    """Every table row of the report with an id: id -> (label, value)."""
    got = page.evaluate(  # type: ignore[attr-defined]
        "() => [...document.querySelectorAll('td[id]')].map((td) => "
        "[td.id, td.parentElement.querySelector('th').textContent, td.textContent])"
    )
    return {i: (label, value) for i, label, value in got}


def _check_cpu(out: Path, data: dict, *, shot: Path | None = None) -> None:
    m = data["best"]["metrics"]
    assert m["step_clock"] == "cpu"
    md = (out / "report.md").read_text()
    assert f"| CPU time per step (s) | {figure(m['step_time_s'])} |" in md
    best = md.split("## Best configuration", 1)[1].split("\n## ", 1)[0]
    assert "| step time (s) |" not in best
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.goto((out / "report.html").as_uri())
        rows = _rows(page)
        assert rows["best-step"] == ("CPU time per step (s)", figure(m["step_time_s"]))
        label, wall = rows["best-wall"]
        assert label.startswith("wall time per step (s") and wall == figure(m["step_wall_time_s"])
        if "best-step-ci" in rows:
            assert rows["best-step-ci"][0] == "CPU time per step (s), 95% interval"
        notes = page.locator("p.note").all_text_contents()
        assert any("measurement.clock cpu" in n for n in notes)
        assert any("the step time is CPU time" in n for n in notes)  # the projection
        if shot is not None:
            page.screenshot(path=str(shot), full_page=True)
        page.close()


def test_the_report_of_a_cpu_clock_study_says_cpu_time(url: str, tmp_path: Path) -> None:
    out = tmp_path / "cpu"
    data = _report(url, CPU, out)
    assert data["best"]["metrics"]["step_wall_time_s"] == pytest.approx(0.1998)
    _check_cpu(out, data)
    # the comparison with the wall-clock study of the model: CPU time on its row only
    page = (out / "report.html").read_text()

    def step_cell(study: str) -> str:  # the step-time column of the comparison (the 8th)
        row = page.split(f"<tr data-study='{study}'>", 1)[1].split("</tr>", 1)[0]
        return row.split("<td>")[8].removesuffix("</td>")

    assert step_cell(CPU).endswith("CPU time; 0.1998 wall")
    assert "CPU" not in step_cell(WALL) and "wall" not in step_cell(WALL)


def test_the_report_of_a_wall_clock_study_is_unchanged(url: str, tmp_path: Path) -> None:
    out = tmp_path / "wall"
    data = _report(url, WALL, out)
    m = data["best"]["metrics"]
    assert "step_clock" not in m
    md = (out / "report.md").read_text()
    assert f"| step time (s) | {figure(m['step_time_s'])} |" in md
    assert "CPU time" not in md.split("## This model on other hardware")[0]
    assert "wall time per step" not in md and "measurement.clock cpu" not in md


@pytest.mark.skipif(not os.environ.get("DSE_REPORT_DEMO"), reason="DSE_REPORT_DEMO not set")
def test_the_report_of_the_readme_demo(tmp_path: Path) -> None:
    """A finished README demo (``dse start --space examples/demo_cpu.yaml``): its report says
    CPU time; ``DSE_REPORT_SHOT=1`` writes docs/results/report_demo.png. The database is
    copied first: the report opens it read-only, but the copy keeps it untouched anyway."""
    src = os.environ["DSE_REPORT_DEMO"].removeprefix("sqlite:///")
    copy = tmp_path / "demo.db"
    copy.write_bytes(Path(src).read_bytes())
    url = f"sqlite:///{copy}"
    with open_storage(url) as st:
        assert st.get_study("demo-cpu").state == "complete"
    out = tmp_path / "demo"
    data = _report(url, "demo-cpu", out)
    shot = RESULTS / "report_demo.png" if os.environ.get("DSE_REPORT_SHOT") else None
    _check_cpu(out, data, shot=shot)
