"""The study loop's parts at their seams: ownership and heartbeat (Reconciler), launch errors
as trial failures, the state after a controller error, imported studies. The loop runs on the
in-process runner with SQLite storage (real storage, no trial processes) where the test is
about the loop; on the local runner where it is about processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.agents import create_agent
from dse.cli.main import main
from dse.core.records import Outcome, TrialRecord
from dse.loop.context import StudyContext
from dse.loop.reconcile import SAME_HOST_STALE_S, STALE_S, Owner, Reconciler
from dse.loop.study import StudyRunner
from dse.runners import OWNER_ENV, InProcessRunner, kill_owned_group
from dse.space.searchspace import params_key, parse_space
from dse.storage import Storage, open_storage
from tests.conftest import EXAMPLES, REPLAY_TABLE


def _sim_space(tmp_path: Path, **upd: Any) -> Any:
    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    d["study"] = "loop"
    d["workload"] = {"name": "replay", "table": str(REPLAY_TABLE)}
    d["budget"] = {"n_trials": 4}
    d["agent"] = {"name": "random", "seed": 0}
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "runs")}
    d["prescreen"] = {"enabled": False}
    d.update(upd)
    return parse_space(d, "test")


def _trial(**kw: Any) -> TrialRecord:
    base: dict[str, Any] = {"id": 1, "study_id": 1, "number": 0, "state": "running",
                            "params": {}, "params_key": "{}"}  # fmt: skip
    return TrialRecord(**{**base, **kw})


# --- ownership ---------------------------------------------------------------------------
def test_owner_parse_roundtrip() -> None:
    o = Owner("node-1", 4242, "abcd1234")
    assert Owner.parse(str(o)) == o
    assert Owner.parse("garbage") is None
    assert Owner.parse(None) is None
    assert Owner.parse("h:notapid:tok") is None


@pytest.mark.parametrize(
    ("owner", "alive", "age", "dead"),
    [
        ("me", True, 10_000.0, False),  # mine, whatever the heartbeat
        ("same-pid-other-token", True, 0.0, True),  # an earlier controller of this process
        ("same-host", False, 0.0, True),  # its pid is gone
        ("same-host", True, 1.0, False),  # alive and beating
        ("same-host", True, SAME_HOST_STALE_S + 1, True),  # alive pid, stale heartbeat (B12)
        ("other-host", True, STALE_S - 1, False),
        ("other-host", True, STALE_S + 1, True),
        (None, True, STALE_S + 1, True),  # no readable owner: the heartbeat decides
        (None, True, 1.0, False),
    ],
)
def test_owner_dead(owner: str | None, alive: bool, age: float, dead: bool) -> None:
    me = Owner("here", 100, "mine0000")
    runner = {
        "me": str(me),
        "same-pid-other-token": "here:100:other000",
        "same-host": "here:200:tok",
        "other-host": "there:100:tok",
        None: None,
    }[owner]
    now = 1_000_000.0
    ctx = StudyContext(_sim_space(Path("/nonexistent")), storage=None, study_id=0)  # type: ignore[arg-type]
    rec = Reconciler(ctx, me=me, clock=lambda: now, alive=lambda pid: alive)
    assert rec.owner_dead(_trial(runner=runner, heartbeat_at=now - age)) is dead


def _storage(tmp_path: Path) -> Storage:
    return open_storage(f"sqlite:///{tmp_path / 'loop.db'}")


def _running_trial(st: Storage, space: Any, owner: str, metrics: Path | None) -> TrialRecord:
    rec, _ = st.get_or_create_study(space_yaml="{}", **space.study_fields())
    key = f"k{time.time_ns()}"
    t = st.claim_trial(study_id=rec.id, params={"micro_batch_size": 1}, params_key=key,
                       budget=10, runner=owner)  # fmt: skip
    assert t is not None
    return st.start_trial(t.id, runner=owner, host="h", log_path=None,
                          metrics_path=None if metrics is None else str(metrics))  # fmt: skip


def test_reconcile_requeues_and_kills_only_owned_groups(tmp_path: Path) -> None:
    space = _sim_space(tmp_path)
    st = _storage(tmp_path)
    dead_owner = "here:999999:dead0000"
    tdir = tmp_path / "trial"
    tdir.mkdir()
    t = _running_trial(st, space, dead_owner, tdir / "metrics.jsonl")
    killed: list[tuple[Path, str]] = []
    rec = Reconciler(
        StudyContext(space, st, t.study_id), Owner("here", os.getpid(), "new00000"),
        alive=lambda pid: False, kill=lambda d, o: killed.append((d, o)) or True,
    )  # fmt: skip
    assert rec.reconcile() == 1
    assert st.get_trial(t.id).state == "queued"
    assert killed == [(tdir, dead_owner)]
    # an imported study: its paths are not trusted, nothing is read or signalled
    t2 = _running_trial(st, space, dead_owner, tdir / "metrics.jsonl")
    (tdir / "metrics.jsonl").write_text(
        json.dumps({"type": "summary", "tflops_per_gpu": 1e308}) + "\n"
    )
    killed.clear()
    rec.trust_paths = False
    rec.reconcile()
    assert st.get_trial(t2.id).state == "queued" and killed == []
    st.close()


def _group(env_token: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if env_token is not None:
        env[OWNER_ENV] = env_token
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)


def test_kill_owned_group_checks_the_token(tmp_path: Path) -> None:
    owner = "here:1:tok00000"
    mine = _group(owner)
    stranger = _group(None)
    try:
        (tmp_path / "pgid").write_text(json.dumps({"pgid": stranger.pid, "owner": owner}))
        assert kill_owned_group(tmp_path, owner) is False  # the group does not carry it
        assert stranger.poll() is None
        (tmp_path / "pgid").write_text(json.dumps({"pgid": mine.pid, "owner": owner}))
        assert kill_owned_group(tmp_path, "here:1:someone") is False  # another owner's row
        assert mine.poll() is None
        (tmp_path / "pgid").write_text(str(stranger.pid))  # the old format: no token
        assert kill_owned_group(tmp_path, owner) is False
        (tmp_path / "pgid").write_text(json.dumps({"pgid": mine.pid, "owner": owner}))
        assert kill_owned_group(tmp_path, owner, grace_s=0.5) is True
        assert mine.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None
    finally:
        for p in (mine, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


# --- the loop ----------------------------------------------------------------------------
def _loop(space: Any, st: Storage, runner: Any, **kw: Any) -> StudyRunner:
    return StudyRunner(space, storage=st, runner=runner, agent=create_agent(space),
                       space_yaml=yaml.safe_dump(space.model_dump(mode="json")),
                       features=None, progress=lambda m: None, **kw)  # fmt: skip


def test_loop_on_the_in_process_runner(tmp_path: Path) -> None:
    from dse.workloads.replay import ReplayTable

    table = ReplayTable.load(REPLAY_TABLE)
    space = _sim_space(tmp_path)
    st = _storage(tmp_path)
    seen: list[int] = []
    loop = _loop(space, st, InProcessRunner(lambda spec: table.outcome(spec.params)),
                 on_trial=lambda r: seen.append(r.number))  # fmt: skip
    res = loop.run()
    assert not res.stopped and res.counts["total"] == 4 and seen == [0, 1, 2, 3]
    assert st.get_study("loop").state == "complete"
    assert not (tmp_path / "runs").exists()  # an in-process runner writes no files
    st.close()


def test_stop_request_is_a_loop_condition(tmp_path: Path) -> None:
    from dse.workloads.replay import ReplayTable

    table = ReplayTable.load(REPLAY_TABLE)
    st = _storage(tmp_path)
    loop = _loop(_sim_space(tmp_path), st, InProcessRunner(lambda s: table.outcome(s.params)))
    loop.on_trial = lambda r: loop.request_stop("enough")
    res = loop.run()
    assert res.stopped and res.stop_reason == "enough" and res.counts["total"] == 1
    assert st.get_study("loop").state == "stopped"
    st.close()


def test_a_sigterm_during_a_proposal_launches_no_trial(tmp_path: Path) -> None:
    """SIGTERM (handled as `dse start` does: a stop request) while the agent proposes the
    second trial: the loop stops without launching it."""
    from dse.workloads.replay import ReplayTable

    table = ReplayTable.load(REPLAY_TABLE)
    st = _storage(tmp_path)
    loop = _loop(_sim_space(tmp_path), st, InProcessRunner(lambda s: table.outcome(s.params)))
    agent = loop.agent
    ask = agent.ask
    asked: list[int] = []

    def ask_and_get_a_sigterm(n: int) -> Any:
        got = ask(n)
        asked.append(n)
        if len(asked) == 2:  # the second proposal: a real SIGTERM arrives meanwhile
            signal.raise_signal(signal.SIGTERM)
        return got

    agent.ask = ask_and_get_a_sigterm  # type: ignore[method-assign]

    def on_signal(signum: int, _frame: Any) -> None:
        loop.request_stop(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        res = loop.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(asked) == 2
    assert res.stopped and res.stop_reason == "signal SIGTERM"
    assert res.counts["total"] == 1  # the first trial only: nothing launched after the signal
    assert [t.number for t in st.list_trials(st.get_study("loop").id)] == [0]
    st.close()


def test_wall_clock_budget_stops_with_a_hint(tmp_path: Path) -> None:
    st = _storage(tmp_path)
    lines: list[str] = []
    space = _sim_space(tmp_path, budget={"n_trials": 4, "wall_clock_s": 1e-6})
    loop = _loop(space, st, InProcessRunner(lambda s: Outcome("ok", {})))
    loop.progress = lines.append
    res = loop.run()
    assert res.stopped and res.stop_kind == "wall_clock" and res.counts["total"] == 0
    assert st.get_study("loop").state == "stopped"
    assert any(x.startswith("to continue: dse resume --study loop --storage") for x in lines)
    assert not any(x.startswith("done:") for x in lines)
    st.close()


class _BrokenRunner(InProcessRunner):
    def poll(self) -> list[Any]:
        if self._pending:
            raise RuntimeError("runner bug")
        return []


def test_controller_error_resets_the_study_state(tmp_path: Path) -> None:
    st = _storage(tmp_path)
    loop = _loop(_sim_space(tmp_path), st, _BrokenRunner(lambda s: Outcome("ok", {})))
    with pytest.raises(RuntimeError, match="runner bug"):
        loop.run()
    assert st.get_study("loop").state == "interrupted"
    trials = st.list_trials(st.get_study("loop").id)
    assert [t.state for t in trials] == ["queued"]  # re-queued, no owner
    assert trials[0].runner is None
    st.close()


def test_missing_trial_python_is_a_trial_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """B14: a missing runner.python fails the trials (TrialLaunchError), the study ends
    stopped, not 'running' with a queued trial and no controller."""
    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    d.update(study="nopy", budget={"n_trials": 5}, prescreen={"enabled": False})
    d["workload"] = {"name": "replay", "table": str(REPLAY_TABLE)}
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "runs"),
                   "python": str(tmp_path / "no" / "python")}  # fmt: skip
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(d))
    url = f"sqlite:///{tmp_path / 's.db'}"
    rc = main(["start", "--space", str(p), "--storage", url])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "could not be launched" in err and "to continue: dse resume" in err
    st = open_storage(url)
    rec = st.get_study("nopy")
    assert rec.state == "stopped"
    trials = st.list_trials(rec.id)
    assert len(trials) == 3 and all(t.state == "failed" for t in trials)
    assert all("launch failed" in (t.reason or "") for t in trials)
    st.close()


def test_resuming_an_import_does_not_run_its_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """B11: an export names runner.python; resuming the imported study runs the local one
    (and with --trust-imported the export's)."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.sh"
    evil.write_text(f'#!/bin/sh\ntouch {marker}\nexec {sys.executable} "$@"\n')
    evil.chmod(0o755)
    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    d.update(study="exp", budget={"n_trials": 1}, prescreen={"enabled": False})
    d["workload"] = {"name": "replay", "table": str(REPLAY_TABLE)}
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "theirs"), "python": str(evil)}
    src = f"sqlite:///{tmp_path / 'src.db'}"
    st = open_storage(src)
    space = parse_space(d, "t")
    st.create_study(space_yaml=yaml.safe_dump(d), **space.study_fields())
    export = st.export_study("exp")
    st.close()
    f = tmp_path / "exp.json"
    f.write_text(json.dumps(export))
    url = f"sqlite:///{tmp_path / 'dst.db'}"
    assert main(["import", str(f), "--storage", url]) == 0
    # the imported table path is refused unconfirmed
    assert main(["resume", "--study", "exp", "--storage", url]) == 2
    assert "workload.table" in capsys.readouterr().err
    # a local space file of the same study replaces the export's run settings
    d_local = {**d, "runner": {"name": "local", "workdir": str(tmp_path / "mine")}}
    p = tmp_path / "local.yaml"
    p.write_text(yaml.safe_dump(d_local))
    assert main(["start", "--space", str(p), "--storage", url]) == 0
    assert not marker.exists() and not (tmp_path / "theirs").exists()
    assert (tmp_path / "mine" / "exp").is_dir()
    # confirmed explicitly, the export's settings are used
    assert main(["import", str(f), "--storage", url, "--study", "exp2"]) == 0
    assert main(["resume", "--study", "exp2", "--storage", url, "--trust-imported"]) == 0
    assert marker.exists() and (tmp_path / "theirs" / "exp2").is_dir()


@pytest.mark.parametrize("host", ["this", "elsewhere"])
def test_an_import_running_elsewhere_is_released(tmp_path: Path, host: str) -> None:
    """An export's running trial names a controller of the exporting installation; with a
    live pid on this host (or another host) and a heartbeat from the future, no age test
    ever found it dead and dse resume waited forever. dse import re-queues it ownerless and
    stops the study, so a resume runs it."""
    import socket

    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    d.update(study="away", budget={"n_trials": 2}, prescreen={"enabled": False})
    d["workload"] = {"name": "replay", "table": str(REPLAY_TABLE)}
    d["runner"] = {"name": "local", "workdir": str(tmp_path / "runs")}
    d["agent"] = {"name": "random", "seed": 0}
    space = parse_space(d, "t")
    src = open_storage(f"sqlite:///{tmp_path / 'src.db'}")
    rec = src.create_study(space_yaml=yaml.safe_dump(d), **space.study_fields())
    src.set_study_state("away", "running")
    base = space.baseline()
    t = src.claim_trial(study_id=rec.id, params=base, params_key=params_key(base), budget=2)
    assert t is not None
    live = subprocess.Popen(["sleep", "300"])
    try:
        name = socket.gethostname() if host == "this" else "other-node"
        owner = f"{name}:{live.pid}:abcd1234"
        src.start_trial(t.id, runner=owner, host=name, log_path=None, metrics_path=None)
        export = src.export_study("away")
        src.close()
        export["trials"][0]["heartbeat_at"] = time.time() + 1e7  # from the future
        f = tmp_path / "away.json"
        f.write_text(json.dumps(export))
        url = f"sqlite:///{tmp_path / 'dst.db'}"
        assert main(["import", str(f), "--storage", url]) == 0
        st = open_storage(url)
        got = st.get_study("away")
        (trial,) = st.list_trials(got.id)
        st.close()
        assert got.state == "stopped"
        assert trial.state == "queued" and trial.runner is None and trial.heartbeat_at is None
        assert "imported" in trial.history[-1]["reason"]
        local = tmp_path / "local.yaml"
        local.write_text(yaml.safe_dump(d))
        done = subprocess.run(
            [sys.executable, "-m", "dse.cli", "start", "--space", str(local), "--storage", url],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        st = open_storage(url)
        trials = st.list_trials(st.get_study("away").id)
        st.close()
        assert [x.state for x in trials] == ["complete", "complete"]
        assert live.poll() is None  # the process the row named was left alone
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize(
    ("runner", "option", "value"),
    [
        ("slurm", "container_image", "docker://registry.example/their-image"),
        ("slurm", "container_mounts", ["/:/host"]),
        ("slurm", "sbatch_args", ["--reservation=theirs"]),
        ("slurm", "srun_args", ["--mpi=pmix"]),
        ("slurm", "env", {"NCCL_DEBUG": "INFO"}),
        # written into the batch script: not on the import's allow-list either
        ("slurm", "partition", "theirs"),
        ("slurm", "account", "theirs"),
        ("slurm", "qos", "theirs"),
        ("slurm", "time_limit", "00:10:00"),
        ("ray", "address", "ray://their-head:10001"),
        ("ray", "env", {"NCCL_DEBUG": "INFO"}),
    ],
)
def test_resuming_an_import_does_not_use_its_runner_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runner: str, option: str, value: Any
) -> None:
    """The runner options of an export that name code or where trials run (a container image,
    mounts, scheduler flags, variables, a Ray cluster) are refused unconfirmed, as
    runner.python and the table path are; a local space file or --trust-imported confirms."""
    from dse.results.run_settings import RunOverrides, strip_imported

    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    d.update(study="opts", budget={"n_trials": 1})
    d["runner"] = {"name": runner, "workdir": str(tmp_path / "theirs"), "options": {option: value}}
    space = parse_space(d, "t")
    with pytest.raises(Exception, match=f"runner.options.{option}"):
        strip_imported(space, RunOverrides(), "t")
    # the same space without the option is taken, with local python and workdir
    d["runner"]["options"] = {}
    mine = strip_imported(parse_space(d, "t"), RunOverrides(), "t")
    assert mine.runner.python is None and mine.runner.workdir == "dse_runs"
    # end to end: dse resume of the imported study refuses before anything runs
    d["runner"]["options"] = {option: value}
    src = open_storage(f"sqlite:///{tmp_path / 'src.db'}")
    src.create_study(space_yaml=yaml.safe_dump(d), **space.study_fields())
    f = tmp_path / "opts.json"
    f.write_text(json.dumps(src.export_study("opts")))
    src.close()
    url = f"sqlite:///{tmp_path / 'dst.db'}"
    assert main(["import", str(f), "--storage", url]) == 0
    capsys.readouterr()
    assert main(["resume", "--study", "opts", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert f"runner.options.{option}" in err and "--trust-imported" in err
    assert not (tmp_path / "theirs").exists()


def test_import_refuses_a_name_that_is_not_a_path_component(tmp_path: Path) -> None:
    from dse.core.exceptions import StudyFormatError

    d = yaml.safe_load((EXAMPLES / "replay_llama1b.yaml").read_text())
    space = parse_space({**d, "study": "ok"}, "t")
    st = _storage(tmp_path)
    st.create_study(space_yaml=yaml.safe_dump(d), **space.study_fields())
    export = st.export_study("ok")
    export["study"]["name"] = "../escape"
    with pytest.raises(StudyFormatError, match="must not contain '/'"):
        st.import_study(export)
    with pytest.raises(StudyFormatError, match="must not be '.' or '..'"):
        st.import_study(st.export_study("ok"), name="..")
    st.close()


def test_trials_do_not_inherit_the_api_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dse.runners import Launch, LocalRunner

    monkeypatch.setenv("DSE_API_TOKEN", "secret-token")
    r = LocalRunner(device="cpu", world_size=1)
    out = tmp_path / "env.txt"
    r.submit(Launch(trial_id=1, number=0, trial_dir=tmp_path, metrics_path=tmp_path / "m",
                    log_path=tmp_path / "log", world_size=1, device="cpu",
                    argv=["sh", "-c", f"env > {out}"]))  # fmt: skip
    deadline = time.monotonic() + 20
    while r.running() and time.monotonic() < deadline:
        r.poll()
        time.sleep(0.05)
    assert out.exists() and "secret-token" not in out.read_text()


def test_ray_and_slurm_trials_do_not_inherit_the_token_or_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the local runner's: a Ray node task starts the trial without the API token and the
    storage URL (it may hold the database password), and sbatch (whose environment every trial
    job gets, --export=ALL) is run without them."""
    from dse.runners.ray_runner import _run_node
    from dse.runners.slurm_runner import submission_env

    monkeypatch.setenv("DSE_API_TOKEN", "secret-token")
    monkeypatch.setenv("DSE_STORAGE", "postgresql+psycopg://dse:db-password@db/dse")
    out = tmp_path / "env.txt"
    rc = _run_node(["sh", "-c", f"env > {out}"], {"MINE": "1"}, str(tmp_path),
                   str(tmp_path / "log"), 0, "elsewhere", ("x", "127.0.0.1"))  # fmt: skip
    text = out.read_text()
    assert rc == 0 and "MINE=1" in text
    assert "secret-token" not in text and "db-password" not in text
    env = submission_env()
    assert "DSE_API_TOKEN" not in env and "DSE_STORAGE" not in env and "PATH" in env
    job = {"SLURM_JOB_ID": "7", "DSE_API_TOKEN": "t", "DSE_STORAGE": "s", "PATH": "/bin"}
    assert submission_env(job) == {"PATH": "/bin"}
