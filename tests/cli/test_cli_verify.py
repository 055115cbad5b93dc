"""``dse verify``: the demo study's best and baseline trained longer with the built-in
trainer (Megatron-Core on CPU) through the study's own runner, a Megatron-Core
``dist_checkpointing`` checkpoint saved midway and reloaded (one rank, and two ranks of one
``torchrun`` over gloo); a planted bad reload fails verification naming it."""

from __future__ import annotations

import importlib.util
import json
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from dse.cli.main import main
from dse.core.records import VERIFY_ATTR, Outcome
from dse.loop.verify import DRIFT_RTOL, verdict
from dse.report.page import _verify_section
from dse.space.searchspace import load_space, params_key
from dse.storage import open_storage
from dse.workloads.megatron.verify import PERTURB_ENV
from tests.api.conftest import make_client
from tests.conftest import EXAMPLES, require_part

DEMO = EXAMPLES / "demo_cpu.yaml"


@pytest.fixture
def verify_parts(megatron_core: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-Core, psutil (its ``torch_dist`` checkpoint writer needs it), and the runs'
    folders (``runner.workdir`` is relative) under ``tmp_path``."""
    if importlib.util.find_spec("psutil") is None:
        require_part(
            "psutil",
            "megatron.core.dist_checkpointing's torch_dist writer imports it "
            "(pip install -e '.[megatron]')",
        )
    monkeypatch.chdir(tmp_path)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _demo_study(tmp_path: Path, world_size: int = 1, best_mbs: int | None = 2) -> str:
    """The demo study (on ``world_size`` CPU ranks) with its baseline and a better
    configuration (micro-batch ``best_mbs``; None: the baseline is the best) stored."""
    text = DEMO.read_text().replace("world_size: 1", f"world_size: {world_size}")
    path = tmp_path / "space.yaml"
    path.write_text(text)
    space = load_space(path)
    url = f"sqlite:///{tmp_path}/verify.db"
    base = space.baseline()
    runs = [(base, 1.0)]
    if best_mbs is not None:
        runs.append(({**base, "micro_batch_size": best_mbs}, 2.0))
    with open_storage(url) as st:
        rec = st.create_study(space_yaml=text, **space.study_fields())
        for params, value in runs:
            t = st.claim_trial(study_id=rec.id, params=params, params_key=params_key(params),
                               budget=9)  # fmt: skip
            assert t is not None
            st.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": value}), value=value)
    return url


@pytest.mark.usefixtures("verify_parts")
def test_verify_prints_the_table_stores_it_and_status_shows_it(tmp_path: Path) -> None:
    url = _demo_study(tmp_path)
    rc, out, err = _run(["verify", "--steps", "8", "--storage", url])
    assert rc == 0, out + err
    assert "first loss" in out and "last loss" in out and "reload" in out
    rows = [ln for ln in out.splitlines() if ln.startswith(("best ", "baseline "))]
    assert [r.split()[0] for r in rows] == ["best", "baseline"]
    assert all(r.split()[1] == "8" and r.endswith("ok") for r in rows)
    assert out.strip().endswith("verdict: verified")
    with open_storage(url) as st:
        (rec,) = st.list_studies()
        stored = st.get_study_attrs(rec.id)[VERIFY_ATTR]
    assert stored["verdict"] == "verified"
    assert stored["best"]["params"]["micro_batch_size"] == 2
    assert len(stored["best"]["losses"]) == 8
    # the reloaded half repeats the continued half's losses
    assert stored["best"]["reloaded_losses"] == pytest.approx(stored["best"]["losses"][4:])
    assert stored["best"]["checkpoint_format"].startswith("megatron.core.dist_checkpointing")
    # the run was a trial of the study's runner: its spec, log and step lines in its folder
    run = tmp_path / "dse_runs" / "demo-cpu" / "verify-best"
    spec = json.loads((run / "trial.json").read_text())
    assert spec["workload"]["verify"] == {"steps": 8}
    assert spec["params"]["micro_batch_size"] == 2
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["type"] for x in lines].count("step") == 8 + 4  # and the reloaded half
    assert not (run / "checkpoint").exists()  # removed once reloaded
    rc, out, _ = _run(["status", "--storage", url])
    assert rc == 0 and "verify (trial 1, 8 steps): verified" in out
    rc, out, _ = _run(["status", "--storage", url, "--format", "json"])
    assert json.loads(out)["verify"]["verdict"] == "verified"
    with make_client(url) as client:
        r = client.get("/api/v1/studies/demo-cpu/verify")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["verdict"] == "verified" and body["steps"] == 8 and body["reasons"] == []
    assert body["best"]["last_loss"] == stored["best"]["last_loss"]
    title, rows, _note = _verify_section(stored)  # the report's section
    assert title == "Verify (trial 1)"
    assert ("verify-verdict", "verdict", "verified") in rows
    assert ("verify-best-reload", "best: checkpoint reload", "ok") in rows


@pytest.mark.usefixtures("verify_parts")
def test_a_reload_that_changes_the_loss_fails_verification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _demo_study(tmp_path)
    with make_client(url) as client:  # not verified yet: a 404 that says what to run
        r = client.get("/api/v1/studies/demo-cpu/verify")
    assert r.status_code == 404 and "dse verify" in r.text
    monkeypatch.setenv(PERTURB_ENV, "0.05")  # the planted bad reload: a weight moved
    rc, out, err = _run(["verify", "--steps", "6", "--storage", url])
    assert rc == 1, out + err
    assert "verdict: failed" in out
    assert "best: checkpoint reload changed the loss: step 3" in out
    assert "FAILED" in out
    with open_storage(url) as st:
        (rec,) = st.list_studies()
        stored = st.get_study_attrs(rec.id)[VERIFY_ATTR]
    assert stored["verdict"] == "failed" and stored["best"]["reload_ok"] is False


def test_the_verdict_names_a_drift_and_a_failed_run() -> None:
    ok = {"last_loss": 2.0, "losses": [3.0, 2.0], "reload_ok": True}
    drifted = {**ok, "last_loss": 2.0 * (1 + 2 * DRIFT_RTOL)}
    assert verdict(ok, ok) == ("verified", [])
    status, reasons = verdict(drifted, ok)
    assert status == "failed" and reasons[0].startswith("best: last loss")
    assert "drifts" in reasons[0]
    status, reasons = verdict(ok, {"error": "the verify process failed: boom", "steps": 8})
    assert status == "failed" and reasons == ["baseline: the verify process failed: boom"]


@pytest.mark.usefixtures("verify_parts")
def test_a_two_rank_study_verifies_on_its_two_ranks(tmp_path: Path) -> None:
    """A study of 2 CPU ranks (DP 2, gloo): the long run is the trial's ``torchrun`` of two
    ranks, each saving and loading its shards of the distributed checkpoint."""
    url = _demo_study(tmp_path, world_size=2, best_mbs=None)
    rc, out, err = _run(["verify", "--steps", "4", "--storage", url])
    assert rc == 0, out + err
    assert "the best is the baseline configuration" in out
    assert "2 rank(s) through the study's local runner" in out
    with open_storage(url) as st:
        (rec,) = st.list_studies()
        stored = st.get_study_attrs(rec.id)[VERIFY_ATTR]
    best = stored["best"]
    assert stored["verdict"] == "verified" and stored["baseline"] is None
    assert best["world_size"] == 2 and best["reload_ok"] is True  # torchrun's WORLD_SIZE
    assert best["reloaded_losses"] == pytest.approx(best["losses"][2:])
    run = tmp_path / "dse_runs" / "demo-cpu" / "verify-best"
    assert json.loads((run / "trial.json").read_text())["world_size"] == 2
