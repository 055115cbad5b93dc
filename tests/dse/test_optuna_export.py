"""``dse export --format optuna``: a dse study in an Optuna RDB storage, opened by Optuna's
analysis and served by optuna-dashboard."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest

from dse.cli import main
from tests.conftest import free_port


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def optuna_url(replay_study: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('optuna') / 'optuna.db'}"
    rc = main(["export", "--storage", replay_study, "--format", "optuna", "--storage-out", url])
    assert rc == 0
    return url


@pytest.fixture
def dashboard(optuna_url: str) -> Iterator[str]:
    from optuna_dashboard import wsgi

    port = free_port()
    server = make_server("127.0.0.1", port, wsgi(optuna_url), handler_class=_Quiet)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def _status(url: str, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert main(["status", "--storage", url, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_optuna_study_holds_the_dse_study(
    replay_study: str, optuna_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    st = _status(replay_study, capsys)
    ost = optuna.load_study(study_name="replay-llama1b", storage=optuna_url)
    assert ost.direction == optuna.study.StudyDirection.MAXIMIZE
    assert ost.best_value == st["best"]["value"]
    assert ost.best_params == st["best"]["params"]
    assert ost.best_trial.user_attrs["peak_mem_gib"] == st["best"]["metrics"]["peak_mem_gib"]
    by_state = dict.fromkeys(("COMPLETE", "FAIL"), 0)
    for t in ost.trials:
        by_state[t.state.name] += 1
    assert by_state["COMPLETE"] == st["counts"]["complete"]
    assert by_state["FAIL"] == st["counts"]["infeasible"] + st["counts"]["failed"]
    failed = [t for t in ost.trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(t.user_attrs["failure_class"] for t in failed)
    # Optuna's own analysis runs on it
    imp = optuna.importance.get_param_importances(
        ost, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
    )
    assert set(imp) == set(st["best"]["params"])


def test_exporting_twice_is_refused(
    replay_study: str, optuna_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["export", "--storage", replay_study, "--format", "optuna", "--storage-out", optuna_url]
    )
    assert rc == 1
    assert "an Optuna study named 'replay-llama1b' exists" in capsys.readouterr().err


def test_optuna_needs_storage_out(replay_study: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--storage", replay_study, "--format", "optuna"]) == 2
    assert "--storage-out" in capsys.readouterr().err


def test_optuna_dashboard_serves_the_exported_study(dashboard: str) -> None:
    with urllib.request.urlopen(f"{dashboard}/api/studies", timeout=30) as r:
        body = json.loads(r.read())
    names = [s["study_name"] for s in body["study_summaries"]]
    assert names == ["replay-llama1b"]
    sid = body["study_summaries"][0]["study_id"]
    with urllib.request.urlopen(f"{dashboard}/api/studies/{sid}?after=0", timeout=30) as r:
        detail = json.loads(r.read())
    assert len(detail["trials"]) == 10


def test_a_pruned_trial_is_optunas_pruned(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from dse.records import Outcome
    from dse.space import params_key, parse_space
    from dse.storage import open_storage
    from tests.conftest import EXAMPLES

    text = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text()
    space = parse_space(yaml.safe_load(text), "tiny")
    url = f"sqlite:///{tmp_path / 'dse.db'}"
    with open_storage(url) as st:
        sid = st.create_study(space_yaml=text, **space.study_fields()).id
        m = {"mode": "adaptive", "measured_steps": 9, "stop_reason": "dominated"}
        for mbs, metrics in ((1, {}), (2, {"measurement": m})):
            p = {**space.baseline(), "micro_batch_size": mbs}
            t = st.claim_trial(study_id=sid, params=p, params_key=params_key(p), budget=5)
            assert t is not None
            out = Outcome("ok", {"tflops_per_gpu": 0.01 * mbs, "steps": 10, **metrics})
            st.finish_trial(t.id, out, value=0.01 * mbs)
    out_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    assert main(["export", "--storage", url, "--format", "optuna", "--storage-out", out_url]) == 0
    ost = optuna.load_study(study_name="tiny-gpt-cpu", storage=out_url)
    states = {t.params["micro_batch_size"]: t for t in ost.trials}
    assert states[1].state == optuna.trial.TrialState.COMPLETE
    assert states[2].state == optuna.trial.TrialState.PRUNED
    assert states[2].intermediate_values == {10: 0.02} and states[2].value is None
    assert ost.best_trial.params["micro_batch_size"] == 1  # Optuna's best ignores it too
