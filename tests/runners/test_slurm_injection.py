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

from dse.cli.main import main
from dse.core.exceptions import SpaceError, TrialLaunchError
from dse.runners import Launch
from dse.runners._cluster import trial_shape
from dse.runners.slurm_runner import SlurmRunner, render_batch_script
from dse.space.searchspace import SlurmOptions, parse_space
from dse.storage import open_storage
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
    # srun notes its arguments (NUL-separated) where asked, drops its options, runs the command
    "srun": '#!/bin/bash\n[[ -z "${DSE_STUB_SRUN_LOG:-}" ]] || printf "%s\\0" "$@" '
    '>>"$DSE_STUB_SRUN_LOG"\nwhile [[ $# -gt 0 && "$1" == -* ]]; do shift; done\nexec "$@"\n',
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


#: A command that writes its arguments, NUL-separated, to the file its $0 names.
_DUMP_ARGS = 'printf "%s\\0" "$@" >"$0"'


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


#: The fields written into #SBATCH lines from the options.
SBATCH_FIELDS = ("partition", "account", "qos", "time_limit", "sbatch_args", "sbatch_args_bare")


def _sbatch_lines(script: str) -> list[str]:
    """The script's header: the lines from the first to the first empty one."""
    lines = script.splitlines()[1:]
    return lines[: lines.index("")]


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("field", SBATCH_FIELDS)
def test_sbatch_values_are_quoted_and_run_nothing_without_the_character_set(
    tmp_path: Path, stub_slurm: Path, monkeypatch: pytest.MonkeyPatch, field: str, payload: str
) -> None:
    """The #SBATCH values with both checks of their character set bypassed (options built
    with ``model_construct``, the script writer's own check ``_checked`` switched off): bash
    reads an #SBATCH line as a comment, so only a line break could start a command there; a
    value with a control character is still refused where it is written, and any other
    value is double-quoted (sbatch takes the quotes off) and runs nothing."""
    from dse.runners import slurm_runner

    monkeypatch.setattr(slurm_runner, "_checked", lambda opts, env: None)
    canary = tmp_path / "pwned"
    p = payload.format(c=canary)
    opts = SlurmOptions.model_construct(**{**SlurmOptions().__dict__, **FIELDS[field](p)})
    launch = _launch(tmp_path / "trial", tmp_path / "ran")
    shape = trial_shape(1, "cpu", None)
    if any(ord(c) < 32 for c in p):
        with pytest.raises(TrialLaunchError, match="control characters"):
            render_batch_script(launch, opts, shape, job_name="j")
        return
    script = render_batch_script(launch, opts, shape, job_name="j")
    header = _sbatch_lines(script)
    assert all(ln.startswith("#SBATCH ") for ln in header), header
    # the payload's line: the value in double quotes, its quotes and backslashes escaped
    quoted = '"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"'
    flag = {"time_limit": "--time=", "sbatch_args": "--comment=", "sbatch_args_bare": ""}.get(
        field, f"--{field}="
    )
    assert f"#SBATCH {flag}{quoted}" in header, header
    _submit(opts, launch, stub_slurm)
    assert (tmp_path / "ran").exists(), stub_slurm.read_text()  # the script ran to the trial
    assert not canary.exists(), f"{field}: the payload ran: {stub_slurm.read_text()}"


@pytest.mark.slurm
def test_the_real_sbatch_takes_the_quoted_values_as_they_are(
    slurm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real sbatch (scripts/slurm_up.sh) reads the quoted #SBATCH values without their
    quotes: the partition, account and time limit as given, and a job name and a comment
    holding each shell payload (the character set bypassed) word for word. The jobs are
    held, then cancelled: none runs."""
    import subprocess

    from dse.runners import slurm_runner

    monkeypatch.setattr(slurm_runner, "_checked", lambda opts, env: None)
    canary = tmp_path / "pwned"
    partition = subprocess.run(
        ["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    shape = trial_shape(1, "cpu", None)
    for i, payload in enumerate(p for p in PAYLOADS if "\n" not in p and "\r" not in p):
        p = payload.format(c=canary)
        opts = SlurmOptions.model_construct(
            **{**SlurmOptions().__dict__, "partition": partition, "account": "acct-1",
               "time_limit": "00:05:00", "sbatch_args": [f"--comment={p}"]}
        )  # fmt: skip
        tdir = tmp_path / f"t{i}"
        tdir.mkdir()
        script = tdir / "job.sbatch"
        script.write_text(
            render_batch_script(_launch(tdir, tmp_path / "m"), opts, shape, job_name=f"j{p}")
        )
        r = subprocess.run(
            ["sbatch", "--parsable", "--hold", str(script)], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        job = r.stdout.strip().split(";")[0]
        try:
            got = {
                k: subprocess.run(
                    ["squeue", "-h", "-j", job, "-o", f"%{k}"], capture_output=True, text=True
                ).stdout.rstrip("\n")
                for k in ("P", "a", "l", "j", "k")
            }
        finally:
            subprocess.run(["scancel", job], check=False)
        assert got == {"P": partition, "a": "acct-1", "l": "5:00", "j": f"j{p}", "k": p}, got
    assert not canary.exists()


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


#: launcher -> its example space
LAUNCHER_EXAMPLES = {
    "bridge": "qwen3_30b_a3b.yaml",
    "megatron_lm": "tiny_gpt_cpu_megatron_lm.yaml",
    "nemo": "llama3_8b.yaml",
}
#: workload.launcher field -> how a payload enters it (the spec's field it lands in)
LAUNCHER_FIELDS: dict[str, tuple[str, Any]] = {
    "override_key": ("overrides", lambda p: {"overrides": {f"a.k{p}": 1}}),
    "override_value": ("overrides", lambda p: {"overrides": {"a.v": p, "a.w": [p, 1]}}),
    "args": ("args", lambda p: {"args": ["--x", p]}),
    "script": ("script", lambda p: {"script": p, "module": None}),
    "module": ("module", lambda p: {"module": p, "script": None}),
    # nemo passes its interpreter only with a script or a module
    "python": ("python", lambda p: {"python": p, "script": "pretrain.py", "module": None}),
    "config_file": ("config_file", lambda p: {"config_file": p, "script": "pretrain.py",
                                              "module": None}),
    "recipe": ("recipe", lambda p: {"recipe": p}),
    "container_image": ("container_image", lambda p: {"container_image": p}),
}  # fmt: skip
#: (launcher, field) that the launcher's command does not hold
NOT_IN_COMMAND = {
    ("megatron_lm", "recipe"), ("megatron_lm", "config_file"), ("nemo", "config_file"),
    *((name, "container_image") for name in LAUNCHER_EXAMPLES),
}  # fmt: skip
#: the master port the batch script computes for the stub's job id 4242
_STUB_PORT = str(20000 + 4242 % 20000)


def _recipe_launch(tmp_path: Path, space: Any, rendered: Any, args_out: Path) -> Launch:
    """A trial of ``rendered`` whose recipe command only prints the arguments it was given
    (the recipe's ``torchrun`` replaced by a program that dumps its argv)."""
    from dse.core.records import TrialSpec

    recipe = {
        **rendered.to_dict(),
        "argv": ["bash", "-c", _DUMP_ARGS, str(args_out), *rendered.argv],
        "node_steps": [], "node_step_names": [],
    }  # fmt: skip
    tdir = tmp_path / "trial"
    spec = TrialSpec(
        study="s", trial_number=0, params={}, model=space.model.model_dump(),
        semantics=space.semantics.model_dump(), world_size=1, device="cpu",
        metrics_path=str(tdir / "metrics.jsonl"), workload={"rendered": recipe},
    )  # fmt: skip
    launch = _launch(tdir, tmp_path / "m")
    # dse's trial process on the first node: here it only runs what follows its "--"
    trial = ["bash", "-c", 'shift 2; exec "$@"', "trial"]
    return Launch(**{**launch.__dict__, "argv": trial, "spec": spec})


@pytest.mark.parametrize("field", sorted(LAUNCHER_FIELDS))
@pytest.mark.parametrize("launcher", sorted(LAUNCHER_EXAMPLES))
def test_launcher_fields_stay_literal_in_the_batch_script(
    tmp_path: Path, stub_slurm: Path, monkeypatch: pytest.MonkeyPatch, launcher: str, field: str
) -> None:
    """Every field of workload.launcher that reaches the recipe's command (override keys and
    values, args, script, module, python, config_file, recipe) or its srun line
    (container_image), with each shell payload, for each launcher: refused by the space file
    naming the field (a control character in a name or path), or passed to the recipe as
    it is, in the batch script (srun runs the recipe's command) and in the dry run's trial
    script; no payload's command runs."""
    import subprocess

    from dse.workloads.launchers._core import launcher_for

    base = yaml.safe_load((EXAMPLES / LAUNCHER_EXAMPLES[launcher]).read_text())
    key, enter = LAUNCHER_FIELDS[field]
    canary = tmp_path / "pwned"
    srun_log = tmp_path / "srun.args"
    monkeypatch.setenv("DSE_STUB_SRUN_LOG", str(srun_log))
    stub = tmp_path / "recipebin"
    stub.mkdir()
    for name in ("torchrun", "python", "nemo"):
        (stub / name).write_text("#!/bin/bash\nexit 0\n")
        (stub / name).chmod(0o755)
    for payload in [*PAYLOADS, "${{MASTER_ADDR}}`touch {c}`"]:
        p = payload.format(c=canary)
        d = json.loads(json.dumps(base))
        d["workload"]["launcher"] = {**d["workload"]["launcher"], **enter(p)}
        d["runner"] = {"name": "slurm", "workdir": str(tmp_path / "runs")}
        try:
            space = parse_space(d, "space.yaml")
        except SpaceError as e:
            assert f"workload.launcher.{key}" in str(e) and "control characters" in str(e), e
            assert any(ord(c) < 32 for c in p), f"{field}={p!r} refused: {e}"
            continue
        spec = space.workload.launcher
        assert spec is not None
        rendered = launcher_for(space).render(space.baseline(), python=spec.python)
        in_command = any("touch" in a for a in rendered.argv)
        assert in_command == ((launcher, field) not in NOT_IN_COMMAND), (p, rendered.argv)
        args_out = tmp_path / "args.bin"
        args_out.unlink(missing_ok=True)
        srun_log.unlink(missing_ok=True)
        stub_slurm.unlink(missing_ok=True)
        _submit(SlurmOptions(), _recipe_launch(tmp_path, space, rendered, args_out), stub_slurm)
        assert args_out.exists(), stub_slurm.read_text()  # the script ran to the recipe
        assert not canary.exists(), f"{field}={p!r}: {stub_slurm.read_text()}"
        # the recipe got its command word for word (the rendezvous placeholders expanded)
        want = [
            a.replace("${MASTER_ADDR}", "node1").replace("${MASTER_PORT}", _STUB_PORT)
            for a in rendered.argv
        ]
        assert args_out.read_bytes().decode().split("\0")[:-1] == want
        if rendered.container_image:  # srun was given the image as one word, as it is
            srun_args = srun_log.read_bytes().decode().split("\0")
            assert f"--container-image={rendered.container_image}" in srun_args, srun_args
        # the dry run's trial script: bash runs it to its end and no payload's command
        r = subprocess.run(
            ["bash", "-c", rendered.script() + "echo dse-end-of-script\n"],
            env={**os.environ, "PATH": f"{stub}:{os.environ['PATH']}"},
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert "dse-end-of-script" in r.stdout and "syntax error" not in r.stderr, r.stderr
        assert not canary.exists(), f"{field}={p!r} (dry run): {rendered.script()}"


def test_the_dry_run_names_an_unchecked_image_on_one_comment_line(tmp_path: Path) -> None:
    """The dry run's trial script names the image in a comment: an image with a line break
    that reached it without the space file's check (a rendered trial built by hand) is
    written escaped, so bash never reads the rest as a command."""
    import subprocess

    from dse.workloads.launchers._core import RenderedTrial

    canary = tmp_path / "pwned"
    for payload in PAYLOADS:
        p = payload.format(c=canary)
        script = RenderedTrial(launcher="nemo", argv=["true"], env={}, container_image=p).script()
        assert sum(ln.startswith("# container image: ") for ln in script.splitlines()) == 1
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
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
    from dse.runners.ray_runner import _run_node

    tdir = tmp_path / "t"
    tdir.mkdir()
    node = ("h", "127.0.0.1")
    argv = ["bash", "-c", "true"]
    assert _run_node(argv, {"BASH_ENV": str(rc)}, str(tdir), str(tdir / "log"), 0, "", node) == 0
    assert canary.exists()  # what the policy keeps out


def test_the_ray_runner_checks_its_environment_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray options built without the space file's validation (``model_construct``): the Ray
    runner refuses a variable the policy keeps out, a name that is not an identifier and a
    NUL in a value itself, naming runner.options.env, before it starts or joins Ray (here
    Ray looks not started, and starting or joining it fails the test: another test of this
    process may have started a real one)."""
    pytest.importorskip("ray")
    import ray

    def no_init(*a: Any, **k: Any) -> None:
        raise AssertionError("the Ray runner started or joined Ray before its check")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_init)

    from dse.runners.ray_runner import RayRunner
    from dse.space.searchspace import RayOptions

    rc = tmp_path / "rc.sh"
    for env, why in (
        ({"BASH_ENV": str(rc)}, "may not be set"),
        ({"LD_PRELOAD": "/tmp/x.so"}, "may not be set"),
        ({"PYTHONSTARTUP": str(rc)}, "may not be set"),
        ({"A;touch x": "1"}, "not an environment variable name"),
        ({"NCCL_DEBUG": "a\0b"}, "NUL"),
    ):
        opts = RayOptions.model_construct(**{**RayOptions().__dict__, "env": env})
        with pytest.raises(TrialLaunchError, match="runner.options.env") as e:
            RayRunner(opts, device="cpu", world_size=1)
        assert why in str(e.value)
        assert not ray.is_initialized()


@pytest.mark.ray
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_shell_text_in_a_ray_env_value_stays_literal(ray_cluster: None, tmp_path: Path) -> None:
    """A Ray trial gets runner.options.env as its environment (the node task starts it with
    an argument list, no shell in between): each payload the policy allows in a value reaches
    the trial as it is, also read by a bash, and none of its commands runs."""
    from dse.runners.ray_runner import RayRunner
    from dse.space.searchspace import RayOptions
    from tests.runners.conftest import drain

    canary = tmp_path / "pwned"
    values = [p.format(c=canary) for p in PAYLOADS if "\n" not in p and "\r" not in p]
    env = {f"NCCL_DSE_TEST_{i}": v for i, v in enumerate(values)}
    runner = RayRunner(RayOptions(env=env), device="cpu", world_size=1)
    out = tmp_path / "env.bin"
    tdir = tmp_path / "trial"
    # the trial: a bash that writes the values it was given (expanded once, as any would)
    dump = 'for v in "${!NCCL_DSE_TEST_@}"; do printf "%s=%s\\0" "$v" "${!v}"; done >"$0"'
    launch = Launch(**{**_launch(tdir, tmp_path / "m").__dict__,
                       "argv": ["bash", "-c", dump, str(out)]})  # fmt: skip
    runner.submit(launch)
    drain(runner, 1, timeout=120)
    got = dict(kv.split("=", 1) for kv in out.read_bytes().decode().split("\0")[:-1])
    assert got == env
    assert not canary.exists()


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
