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

from dse.cli.main import main
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

    from dse.core.records import Outcome
    from dse.space.searchspace import params_key, parse_space
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


def _dashboard_trials(base: str, name: str) -> list[dict] | None:
    """The trials optuna-dashboard serves for the study ``name`` (None: not listed yet)."""
    with urllib.request.urlopen(f"{base}/api/studies", timeout=30) as r:
        studies = json.loads(r.read())["study_summaries"]
    sid = next((s["study_id"] for s in studies if s["study_name"] == name), None)
    if sid is None:
        return None
    with urllib.request.urlopen(f"{base}/api/studies/{sid}?after=0", timeout=30) as r:
        return json.loads(r.read())["trials"]


def test_follower_keeps_a_running_study_live_in_optuna_dashboard(tmp_path) -> None:
    """A running study's trials appear in the user's optuna-dashboard one by one as they
    finish (the follower writes each once), and the follower stops when the study is done."""
    import time

    import yaml
    from optuna_dashboard import wsgi

    from dse.core.records import Outcome
    from dse.interop.optuna_export import follow_study
    from dse.space.searchspace import params_key, parse_space
    from dse.storage import open_storage
    from tests.conftest import EXAMPLES

    text = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text()
    space = parse_space(yaml.safe_load(text), "tiny")
    url = f"sqlite:///{tmp_path / 'dse.db'}"
    out_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=out_url, study_name="someone-else")  # left alone
    storage = open_storage(url)
    sid = storage.create_study(space_yaml=text, **space.study_fields()).id
    storage.set_study_state("tiny-gpt-cpu", "running")

    port = free_port()
    server = make_server("127.0.0.1", port, wsgi(out_url), handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    passes: list[int] = []
    result: list[int] = []
    follower_storage = open_storage(url)
    th = threading.Thread(
        target=lambda: result.append(
            follow_study(
                follower_storage, "tiny-gpt-cpu", out_url, interval_s=0.05, on_sync=passes.append
            )
        ),
        daemon=True,
    )
    th.start()

    def wait_for(n: int) -> list[dict]:
        for _ in range(600):
            got = _dashboard_trials(base, "tiny-gpt-cpu")
            if got is not None and len(got) >= n:
                return got
            time.sleep(0.05)
        raise AssertionError(f"optuna-dashboard never showed {n} trials (got {got!r})")

    try:
        assert wait_for(0) == []  # the study is listed before its first trial finishes
        for i, mbs in enumerate((1, 2, 4)):
            p = {**space.baseline(), "micro_batch_size": mbs}
            t = storage.claim_trial(study_id=sid, params=p, params_key=params_key(p), budget=5)
            assert t is not None
            storage.start_trial(t.id, runner="r", host="h", log_path="l", metrics_path="m")
            # a running trial is not shown (it has no outcome yet)
            assert len(wait_for(i)) == i
            storage.finish_trial(
                t.id, Outcome("ok", {"tflops_per_gpu": 0.1 * mbs}), value=0.1 * mbs
            )
            shown = wait_for(i + 1)
            assert len(shown) == i + 1  # the finished trial appears, once
            assert shown[-1]["state"] == "Complete"
            assert shown[-1]["values"] == [pytest.approx(0.1 * mbs)]
        storage.set_study_state("tiny-gpt-cpu", "complete")
        th.join(timeout=60)
        assert not th.is_alive(), "the follower did not stop when the study completed"
        assert result == [3] and sum(passes) == 3
    finally:
        server.shutdown()
        server.server_close()
        storage.close()
        follower_storage.close()
    ost = optuna.load_study(study_name="tiny-gpt-cpu", storage=out_url)
    assert sorted(t.user_attrs["dse_number"] for t in ost.trials) == [0, 1, 2]
    assert ost.best_params["micro_batch_size"] == 4
    # a second follower of the finished study adds nothing twice
    with open_storage(url) as again:
        assert follow_study(again, "tiny-gpt-cpu", out_url, interval_s=0.01) == 0
    assert len(optuna.load_study(study_name="tiny-gpt-cpu", storage=out_url).trials) == 3


def test_follow_refuses_an_optuna_study_of_another_dse_study(tmp_path) -> None:
    import yaml

    from dse.core.exceptions import DSEError
    from dse.interop.optuna_export import follow_study
    from dse.space.searchspace import parse_space
    from dse.storage import open_storage
    from tests.conftest import EXAMPLES

    text = (EXAMPLES / "tiny_gpt_cpu.yaml").read_text()
    space = parse_space(yaml.safe_load(text), "tiny")
    out_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(storage=out_url, study_name="tiny-gpt-cpu")  # the user's own
    with open_storage(f"sqlite:///{tmp_path / 'dse.db'}") as st:
        st.create_study(space_yaml=text, **space.study_fields())
        with pytest.raises(DSEError, match="was not written for dse study 'tiny-gpt-cpu'"):
            follow_study(st, "tiny-gpt-cpu", out_url, interval_s=0.01, timeout_s=1)
    assert optuna.load_study(study_name="tiny-gpt-cpu", storage=out_url).trials == []


def test_cli_follow_of_a_finished_study_writes_it_and_returns(
    replay_study: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dse.storage import open_storage

    with open_storage(replay_study) as st:
        st.set_study_state("replay-llama1b", "complete")
    url = f"sqlite:///{tmp_path / 'live.db'}"
    args = ["export", "--storage", replay_study, "--format", "optuna", "--storage-out", url]
    assert main([*args, "--follow", "--interval", "0.01"]) == 0
    assert "10 trials written" in capsys.readouterr().err
    assert len(optuna.load_study(study_name="replay-llama1b", storage=url).trials) == 10
    assert main([*args, "--follow", "--interval", "0.01"]) == 0  # again: nothing twice
    assert len(optuna.load_study(study_name="replay-llama1b", storage=url).trials) == 10
