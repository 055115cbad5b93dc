"""``dse best --format megatron|bridge|nemo`` is the knob and environment part of the best
trial's launch command, byte for byte, for studies run through each recipe launcher.

* Studies run here on CPU through the ``megatron_lm``, ``bridge`` and ``nemo`` launchers: the
  recipe's interpreter is a stand-in that prints Megatron-LM iteration lines
  (``fake_recipe.py``) whatever it is given; what is compared is what dse rendered, stored
  in the best trial's ``trial.json`` (``workload.rendered``) and ran, against what
  ``dse best`` prints.
* The dry-run goldens of the example recipes (``tests/fixtures/golden/dryrun_*.txt``, what
  ``dse start --dry-run`` prints, checked by test_launchers.py / test_omni_dryrun.py): each
  golden trial stored as a study's best, ``dse best`` prints that golden's ``export`` lines
  and the tail of its command.

The launch command is ``entry + semantics + fixed overrides + knob part`` (``Launcher.render``):
the part before the knobs is rendered here from the launcher, which does not depend on the
knob values, and the rest of the stored command must be exactly what ``dse best`` printed.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml

from dse.cli.main import main
from dse.core.records import Outcome
from dse.results.best_formats import EXPORT_TARGETS
from dse.space.searchspace import SearchSpace, load_space, params_key, parse_space
from dse.storage import open_storage
from dse.workloads.launchers import launcher_for
from dse.workloads.launchers._core import shell_word
from tests.conftest import EXAMPLES

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
FAKE_RECIPE = Path(__file__).resolve().parent / "fake_recipe.py"
FORMAT_OF = {target: fmt for fmt, target in EXPORT_TARGETS.items()}


def _best(url: str, fmt: str) -> str:
    out = StringIO()
    with redirect_stdout(out):
        assert main(["best", "--storage", url, "--format", fmt]) == 0
    return out.getvalue()


def _head(space: SearchSpace, python: str | None) -> list[str]:
    """The launch command before its knob part (knob-independent)."""
    launcher = launcher_for(space)
    return [*launcher.entry(python), *launcher.semantics_overrides(), *launcher.fixed_overrides()]


def _expected(env: dict[str, str], knob_words: list[str]) -> str:
    """The export of a trial whose ranks get ``env`` and whose command ends in ``knob_words``,
    each word quoted as the launch command quotes it (``RenderedTrial.script``)."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return "\n".join([*lines, " ".join(shell_word(a) for a in knob_words)]) + "\n"


# --- studies run on CPU through each launcher ------------------------------------------------


def _cpu_space(tmp_path: Path, target: str) -> Path:
    """A tiny study of ``target`` on one CPU rank whose recipe is the stand-in."""
    interp = tmp_path / "recipe-python"
    interp.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_RECIPE))} --iters 6 "
        f"--sleep 0 --step-ms 50 --pidfile {shlex.quote(str(tmp_path))}/recipe-$$.pid\n"
    )
    interp.chmod(0o755)
    launcher: dict[str, Any] = {
        "python": str(interp), "log_format": "megatron", "check_resolved": False,
    }  # fmt: skip
    if target == "bridge":
        launcher.update(recipe="tiny_gpt_pretrain_config", overrides={"checkpoint.save": None})
    elif target == "nemo":
        launcher.update(recipe="tiny_gpt", script="pretrain.py")
    else:
        launcher.update(overrides={"--eval-iters": 0})
    data = {
        "version": 1, "study": f"best-export-{target}", "recipe": "stand-in recipe",
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                  "ffn_hidden_size": 128, "vocab_size": 1024, "activation": "gelu"},
        "semantics": {"global_batch_size": 8, "seq_length": 64, "steps": 4, "warmup_steps": 1,
                      "precision": "bf16", "lr": 1e-4, "data": {"kind": "synthetic"}},
        "resources": {"world_size": 1, "device": "cpu", "features": []},
        "knobs": {"micro_batch_size": {"values": [1, 2], "baseline": 1},
                  "bias_activation_fusion": {"type": "bool", "baseline": False},
                  "overlap_grad_reduce": {"type": "bool", "baseline": True}},
        "fixed": {"use_distributed_optimizer": True},
        "env": {"fixed": {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "lo eth0"},
                "knobs": {"CUDA_DEVICE_MAX_CONNECTIONS": {"values": [1, 32], "baseline": 32}}},
        "objective": {"metric": "tflops_per_gpu", "direction": "maximize"},
        "budget": {"n_trials": 2, "remeasure": 0, "trial_timeout_s": 120, "hang_timeout_s": 60},
        "agent": {"name": "random", "seed": 3},
        "runner": {"name": "local", "workdir": str(tmp_path / "runs")},
        "workload": {"name": target, "launcher": launcher},
    }  # fmt: skip
    path = tmp_path / f"{target}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("target", ["megatron_lm", "bridge", "nemo"])
def test_a_studys_export_is_its_best_trials_launch_command(tmp_path: Path, target: str) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    path = _cpu_space(tmp_path, target)
    assert main(["start", "--space", str(path), "--storage", url]) == 0
    best = json.loads(_best(url, "json"))
    with open_storage(url) as st:
        rec = st.get_study(best["study"])
        trials = st.list_trials(rec.id)
        t = st.get_trial_by_number(rec.id, best["trial"], with_steps=False)
    assert [x.state for x in trials] == ["complete"] * len(trials), [x.reason for x in trials]
    assert t.log_path is not None
    spec = json.loads((Path(t.log_path).parent / "trial.json").read_text())
    ran = spec["workload"]["rendered"]  # what the trial process started
    space = load_space(path)
    head = _head(space, space.workload.launcher.python)
    assert ran["argv"][: len(head)] == head
    text = _best(url, FORMAT_OF[target])
    assert text == _expected(ran["env"], ran["argv"][len(head) :])
    # the trial really got that environment and those knob values
    assert ran["env"]["NCCL_SOCKET_IFNAME"] == "lo eth0"
    assert "export NCCL_SOCKET_IFNAME='lo eth0'\n" in text
    assert f"CUDA_DEVICE_MAX_CONNECTIONS={t.params['env.CUDA_DEVICE_MAX_CONNECTIONS']}" in text
    if target == "megatron_lm":  # the GELU model's flag, as the trial ran it
        assert "--no-bias-gelu-fusion" in text and "swiglu" not in text


# --- the dry-run goldens of the example recipes ----------------------------------------------

#: golden file -> example space (each renders through its own launcher)
GOLDENS = {
    "dryrun_llama3_8b.txt": "llama3_8b.yaml",
    "dryrun_llama3_8b_megatron_lm.txt": "llama3_8b_megatron_lm.yaml",
    "dryrun_qwen3_30b_a3b.txt": "qwen3_30b_a3b.yaml",
    "dryrun_nemotron_omni.txt": "nemotron_omni.yaml",
}
_TRIAL = re.compile(r"^## trial (\d+): (\{.*\})$", re.M)


def _golden_trials(name: str) -> list[tuple[dict[str, Any], list[str], str]]:
    """(params, export lines, command on one line) of each trial of a dry-run golden."""
    text = (GOLDEN / name).read_text()
    heads = list(_TRIAL.finditer(text))
    out = []
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = [ln for ln in text[m.end() : end].strip("\n").split("\n") if ln]
        exports = [ln for ln in body if ln.startswith("export ")]
        command = "\n".join(ln for ln in body if not ln.startswith(("#", "export ")))
        out.append((json.loads(m.group(2)), exports, command.replace(" \\\n    ", " ")))
    return out


CASES = [
    (golden, example, i)
    for golden, example in GOLDENS.items()
    for i in range(len(_golden_trials(golden)))
]


@pytest.mark.parametrize(("golden", "example", "trial"), CASES)
def test_the_export_of_a_golden_trial_is_its_dry_run_command(
    tmp_path: Path, golden: str, example: str, trial: int
) -> None:
    sorted_params, exports, command = _golden_trials(golden)[trial]
    text = (EXAMPLES / example).read_text()
    space = parse_space(yaml.safe_load(text), example)
    # the golden shows the trial's knobs sorted; a proposal holds them in the space's order
    # (the order they are stored, launched and exported in)
    params = {k: sorted_params[k] for k in space.knobs if k in sorted_params}
    assert params == sorted_params
    url = f"sqlite:///{tmp_path}/s.db"
    with open_storage(url) as st:  # the golden trial, stored as the study's best
        rec = st.create_study(space_yaml=text, **space.study_fields())
        t = st.claim_trial(study_id=rec.id, params=params, params_key=params_key(params),
                           budget=9)  # fmt: skip
        assert t is not None
        st.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": 1.0}), value=1.0)
    out = _best(url, FORMAT_OF[space.workload.name])
    *env_lines, knob_line = out.rstrip("\n").split("\n")
    assert env_lines == exports  # byte for byte, the golden's own lines
    head = " ".join(shell_word(a) for a in _head(space, space.workload.launcher.python))
    assert command == f"{head} {knob_line}"  # the golden command ends in exactly these words


def test_the_golden_cases_cover_every_launcher() -> None:
    covered = {load_space(EXAMPLES / ex).workload.name for ex in GOLDENS.values()}
    assert covered == set(EXPORT_TARGETS.values())
