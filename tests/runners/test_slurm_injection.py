"""No shell command from a space file, an export or a launcher override runs in a trial's
Slurm batch script.

Every field the batch script holds is tried with shell payloads (a line break, ``;``,
``$(...)``, backquotes, quotes). A payload is either refused where it enters (the space
file's validation names the field) or, where the field may hold it, the rendered script is
submitted through the runner to stub Slurm commands on PATH (``sbatch`` runs the script with
bash as a batch step would, ``srun`` runs its command) and the payload's command must not
have run. Options built without validation (``model_construct``) are rendered too: the
script's writer refuses them itself.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.cli import main
from dse.exceptions import SpaceError, TrialLaunchError
from dse.space import SlurmOptions, parse_space
from dse.storage import open_storage
from dse.workloads.runners import Launch
from dse.workloads.runners._cluster import trial_shape
from dse.workloads.runners.slurm_runner import SlurmRunner, render_batch_script
from tests.conftest import EXAMPLES

#: Shell payloads; ``{c}`` is the canary file the payload's command would create.
PAYLOADS = [
    "x\ntouch {c}\n",
    "x\rtouch {c}",
    "x; touch {c}",
    "x$(touch {c})",
    "x`touch {c}`",
    "x' ; touch {c}; '",
    'x" ; touch {c}; "',
    "x && touch {c} #",
]

#: field -> how a payload enters the options (the 7 fields of the batch script and the rest).
FIELDS: dict[str, Any] = {
    "partition": lambda p: {"partition": p},
    "account": lambda p: {"account": p},
    "qos": lambda p: {"qos": p},
    "time_limit": lambda p: {"time_limit": p},
    "sbatch_args": lambda p: {"sbatch_args": [f"--comment={p}"]},
    "sbatch_args_bare": lambda p: {"sbatch_args": [p]},
    "srun_args": lambda p: {"srun_args": [f"--mpi={p}"]},
    "env_key": lambda p: {"env": {f"A{p}": "1"}},
    "env_value": lambda p: {"env": {"NCCL_DEBUG": p}},
    "container_image": lambda p: {"container_image": p},
    "container_mounts": lambda p: {"container_mounts": [f"/data:/{p}"]},
}

_STUBS = {
    # sbatch runs the batch script at once (a one-node batch step) and answers a job id
    "sbatch": '#!/bin/bash\nscript="${@: -1}"\nSLURM_JOB_ID=4242 SLURM_JOB_NODELIST=node1 '
    'bash "$script" >"$DSE_STUB_LOG" 2>&1\necho 4242\n',
    # srun drops its own options and runs the command
    "srun": '#!/bin/bash\nwhile [[ $# -gt 0 && "$1" == -* ]]; do shift; done\nexec "$@"\n',
    "scontrol": "#!/bin/bash\necho node1\n",
    "squeue": "#!/bin/bash\nexit 0\n",
    "scancel": "#!/bin/bash\nexit 0\n",
}


@pytest.fixture
def stub_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stub Slurm commands first on PATH; returns the stub sbatch's log of the script's run."""
    bindir = tmp_path / "stubbin"
    bindir.mkdir()
    for name, text in _STUBS.items():
        f = bindir / name
        f.write_text(text)
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "batch.log"
    monkeypatch.setenv("DSE_STUB_LOG", str(log))
    return log


_DUMP_ARGS = "import json, sys; json.dump(sys.argv[2:], open(sys.argv[1], 'w'))"


def _launch(tdir: Path, marker: Path, env: dict[str, str] | None = None) -> Launch:
    # the trial itself only leaves a marker: the script ran to its end
    return Launch(
        trial_id=1, number=0, argv=["touch", str(marker)], trial_dir=tdir,
        metrics_path=tdir / "metrics.jsonl", log_path=tdir / "log.txt", world_size=1,
        device="cpu", timeout_s=60, env=env or {},
    )  # fmt: skip


def _submit(opts: SlurmOptions, launch: Launch, log: Path) -> None:
    """Submit ``launch`` through the Slurm runner (stub commands): sbatch runs the script."""
    runner = SlurmRunner(opts, device="cpu", world_size=1)
    runner.submit(launch)
    assert log.exists(), "the stub sbatch did not run the script"


def _space_data(tmp_path: Path, options: dict[str, Any], workdir: str | None = None) -> Any:
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    d["runner"] = {
        "name": "slurm", "workdir": workdir or str(tmp_path / "runs"), "options": options,
    }  # fmt: skip
    return d


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_no_payload_of_a_slurm_option_runs(
    tmp_path: Path, stub_slurm: Path, field: str, payload: str
) -> None:
    canary = tmp_path / "pwned"
    p = payload.format(c=canary)
    options = FIELDS[field](p)
    # through the space file: refused naming the field, or taken and harmless
    try:
        space = parse_space(_space_data(tmp_path, options), "space.yaml")
    except SpaceError as e:
        key = field.split("_bare")[0] if field != "env_key" else "env"
        assert f"runner.options.{key.replace('env_value', 'env')}" in str(e)
    else:
        opts = space.runner.options
        assert isinstance(opts, SlurmOptions)
        marker = tmp_path / "ran"
        _submit(opts, _launch(tmp_path / "trial", marker), stub_slurm)
        assert marker.exists(), stub_slurm.read_text()  # the script ran to the trial
        assert not canary.exists(), f"{field}: the payload ran: {stub_slurm.read_text()}"
    # built without validation: the script's writer refuses it, or it runs nothing
    opts = SlurmOptions.model_construct(**{**SlurmOptions().__dict__, **options})
    stub_slurm.unlink(missing_ok=True)
    marker = tmp_path / "ran2"
    try:
        _submit(opts, _launch(tmp_path / "trial2", marker), stub_slurm)
    except TrialLaunchError:
        pass
    else:
        assert marker.exists(), stub_slurm.read_text()
    assert not canary.exists(), f"{field} (unvalidated): the payload ran"


@pytest.mark.parametrize("payload", PAYLOADS)
def test_no_payload_of_a_trial_path_runs(tmp_path: Path, stub_slurm: Path, payload: str) -> None:
    """runner.workdir (and so every trial path in #SBATCH lines and the script) with a
    payload: a control character is refused by the space file and by the script's writer;
    anything else is quoted (sbatch's own quoting on #SBATCH lines) and runs nothing."""
    canary = tmp_path / "pwned"
    p = payload.format(c=canary)
    workdir = str(tmp_path / f"runs{p}")
    try:
        parse_space(_space_data(tmp_path, {}, workdir=workdir), "space.yaml")
    except SpaceError as e:
        assert "runner.workdir" in str(e)
    tdir = Path(workdir) / "study" / "trial-00000"
    marker = tmp_path / "ran"
    try:
        tdir.mkdir(parents=True)
    except OSError:
        pytest.skip("this file system cannot hold the path")
    try:
        _submit(SlurmOptions(), _launch(tdir, marker), stub_slurm)
    except TrialLaunchError as e:
        assert "control characters" in str(e)
    else:
        assert marker.exists(), stub_slurm.read_text()
        script = (tdir / "job.sbatch").read_text()
        assert all(ln.startswith("#SBATCH ") for ln in script.splitlines()[1:6])
    assert not canary.exists(), "the trial path's payload ran"


@pytest.mark.parametrize("payload", PAYLOADS)
def test_no_payload_of_the_job_name_or_an_env_key_of_the_launch_runs(
    tmp_path: Path, payload: str
) -> None:
    """What the runner adds itself (the job name from the study name, the trial's own
    variables) is checked by the script's writer too."""
    canary = tmp_path / "pwned"
    p = payload.format(c=canary)
    tdir = tmp_path / "t"
    shape = trial_shape(1, "cpu", None)
    bad_env = _launch(tdir, tmp_path / "m", env={f"A{p}": "1"})
    with pytest.raises(TrialLaunchError, match="not a variable name"):
        render_batch_script(bad_env, SlurmOptions(), shape, job_name="j")
    script = None
    try:
        script = render_batch_script(
            _launch(tdir, tmp_path / "m"), SlurmOptions(), shape, job_name=f"dse-{p}"
        )
    except TrialLaunchError as e:
        assert "control characters" in str(e)
    if script is not None:
        name_line = next(ln for ln in script.splitlines() if "--job-name" in ln)
        assert name_line.startswith('#SBATCH --job-name="') and "\n" not in name_line


def test_launcher_overrides_stay_literal_in_the_batch_script(
    tmp_path: Path, stub_slurm: Path
) -> None:
    """A recipe's override value with shell text reaches the recipe as it is, in the batch
    script (srun runs the recipe's command) and in the dry run's trial script."""
    from dse.workloads.launchers._core import launcher_for

    canary = tmp_path / "pwned"
    d = yaml.safe_load((EXAMPLES / "llama3_8b.yaml").read_text())
    values = [f"x$(touch {canary})", f"${{MASTER_ADDR}}`touch {canary}`", f"a;touch {canary}"]
    d["workload"]["launcher"]["overrides"] = {f"a.b{i}": v for i, v in enumerate(values)}
    d["runner"] = {"name": "slurm", "workdir": str(tmp_path / "runs")}
    space = parse_space(d, "space.yaml")
    rendered = launcher_for(space).render(space.baseline())
    # the recipe's "torchrun": print the arguments it was given
    args_out = tmp_path / "args.json"
    recipe = {
        **rendered.to_dict(),
        "argv": ["python3", "-c", _DUMP_ARGS, str(args_out), *rendered.argv],
        "container_image": None,
        "node_steps": [], "node_step_names": [],
    }  # fmt: skip
    from dse.records import TrialSpec

    tdir = tmp_path / "trial"
    spec = TrialSpec(
        study="s", trial_number=0, params={}, model=space.model.model_dump(),
        semantics=space.semantics.model_dump(), world_size=1, device="cpu",
        metrics_path=str(tdir / "metrics.jsonl"), workload={"rendered": recipe},
    )  # fmt: skip
    launch = _launch(tdir, tmp_path / "m")
    # dse's trial process on the first node: here it only runs what follows its "--"
    trial = ["bash", "-c", 'shift 2; exec "$@"', "trial"]
    launch = Launch(**{**launch.__dict__, "argv": trial, "spec": spec})
    _submit(SlurmOptions(), launch, stub_slurm)
    got = json.loads(args_out.read_text())
    assert not canary.exists(), stub_slurm.read_text()
    for i, v in enumerate(values):
        want = v.replace("${MASTER_ADDR}", "node1")  # the rendezvous placeholder expands
        assert any(a.endswith(f"a.b{i}={want}") for a in got), (want, got)
    # the dry run's trial script: bash runs it to its end (no command of the overrides)
    script = rendered.script()
    stub = tmp_path / "recipebin"
    stub.mkdir()
    for name in ("torchrun", "python", "nemo"):
        (stub / name).write_text("#!/bin/bash\nexit 0\n")
        (stub / name).chmod(0o755)
    import subprocess

    r = subprocess.run(
        ["bash", "-c", script], env={**os.environ, "PATH": f"{stub}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not canary.exists(), script


def test_ray_options_refuse_shell_text_and_loader_variables(tmp_path: Path) -> None:
    """The Ray runner's address and environment: a Ray node task starts the trial with
    them; an address is a Ray address, and the environment follows the one policy (BASH_ENV
    would make every bash the trial starts run a file of the space's choosing)."""
    canary = tmp_path / "pwned"
    rc = tmp_path / "rc.sh"
    rc.write_text(f"touch {canary}\n")
    d = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    for options, field in (
        ({"address": f"auto; touch {canary}"}, "address"),
        ({"address": "ray://head:10001\n"}, "address"),
        ({"env": {"BASH_ENV": str(rc)}}, "env"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "env"),
        ({"env": {"A;touch x": "1"}}, "env"),
    ):
        d["runner"] = {"name": "ray", "options": options}
        with pytest.raises(SpaceError, match=f"runner.options.{field}"):
            parse_space(d, "space.yaml")
    # the node task with the variable the policy refuses would have run the file
    from dse.workloads.runners.ray_runner import _run_node

    tdir = tmp_path / "t"
    tdir.mkdir()
    node = ("h", "127.0.0.1")
    argv = ["bash", "-c", "true"]
    assert _run_node(argv, {"BASH_ENV": str(rc)}, str(tdir), str(tdir / "log"), 0, "", node) == 0
    assert canary.exists()  # what the policy keeps out


def test_an_import_with_shell_text_in_its_slurm_options_runs_nothing(
    tmp_path: Path, stub_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export whose space file carries a payload in a Slurm option is refused at import
    (its space file does not validate); one whose options are valid but not on the import's
    allow-list is imported and refused at a plain ``dse resume`` (no sbatch runs)."""
    canary = tmp_path / "pwned"
    good = _space_data(tmp_path, {"partition": "theirs"})
    good.update(study="imp", budget={"n_trials": 1})
    space = parse_space(good, "t")
    src = open_storage(f"sqlite:///{tmp_path / 'src.db'}")
    src.create_study(space_yaml=yaml.safe_dump(good), **space.study_fields())
    export = src.export_study("imp")
    src.close()
    url = f"sqlite:///{tmp_path / 'dst.db'}"
    bad = json.loads(json.dumps(export))
    bad_space = yaml.safe_load(bad["study"]["space_yaml"])
    bad_space["runner"]["options"]["partition"] = f"x\ntouch {canary}"
    bad["study"]["space_yaml"] = yaml.safe_dump(bad_space)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(bad))
    assert main(["import", str(f), "--storage", url]) == 2
    assert "partition" in capsys.readouterr().err
    f = tmp_path / "good.json"
    f.write_text(json.dumps(export))
    assert main(["import", str(f), "--storage", url]) == 0
    capsys.readouterr()
    assert main(["resume", "--study", "imp", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert "runner.options.partition" in err and "--trust-imported" in err
    assert not stub_slurm.exists()  # no batch script ran
    assert not canary.exists()
