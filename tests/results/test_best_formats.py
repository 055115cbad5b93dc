"""``best_payload`` and ``render_best`` (what ``dse best`` and ``GET .../best`` print), on a
real SQLite storage. The launcher formats are the knob and environment part of the best
trial's launch command on each recipe target, rendered by that target's launcher plugin
(``launch_flags``); a value a target cannot express is refused by name, never translated.
(The byte-for-byte comparison with stored launch commands: tests/workloads/test_best_export.py.)
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from typing import Any

import pytest
import yaml

from dse.cli.main import main
from dse.core.exceptions import DSEError, NoEquivalentError
from dse.core.records import BEST_FORMATS, Outcome, StudyRecord
from dse.results.best_formats import EXPORT_TARGETS, best_payload, best_space, render_best
from dse.space.searchspace import SearchSpace, load_space, parse_space
from dse.storage import Storage, open_storage
from dse.workloads.launchers.flags import export_text, launch_flags
from tests.conftest import EXAMPLES

SPACE = EXAMPLES / "tiny_gpt_cpu.yaml"
BEST = {
    "tensor_model_parallel_size": 2, "micro_batch_size": 4, "recompute": "full",
    "attention_backend": "unfused", "use_distributed_optimizer": True,
}  # fmt: skip


@pytest.fixture
def storage() -> Iterator[Storage]:
    with open_storage("sqlite:///:memory:") as st:
        yield st


def study(storage: Storage, text: str | None = None) -> StudyRecord:
    text = SPACE.read_text() if text is None else text
    space = parse_space(yaml.safe_load(text), "test")
    return storage.create_study(space_yaml=text, **space.study_fields())


def finish(storage: Storage, rec: StudyRecord, params: dict, out: Outcome, value: float | None):
    t = storage.claim_trial(
        study_id=rec.id, params=params, params_key=json.dumps(params, sort_keys=True), budget=9
    )
    assert t is not None
    storage.finish_trial(t.id, out, value=value)


def ok(tflops: float) -> Outcome:
    return Outcome(
        "ok", {"tflops_per_gpu": tflops, "peak_mem_gib": 0.2, "step_time_s": 0.1, "loss": 6.9}
    )


def test_no_complete_trial_yet_is_an_error_naming_the_study(storage: Storage) -> None:
    rec = study(storage)
    finish(storage, rec, {"micro_batch_size": 2}, Outcome.failure("oom", "CUDA OOM"), None)
    with pytest.raises(DSEError, match="'tiny-gpt-cpu' has no complete trial yet"):
        best_payload(storage, rec)


def test_the_payload_is_the_best_feasible_trial_with_every_knob(storage: Storage) -> None:
    rec = study(storage)
    finish(storage, rec, {"micro_batch_size": 1}, ok(2.0), 2.0)
    finish(storage, rec, BEST, ok(3.5), 3.5)
    finish(storage, rec, {"micro_batch_size": 2}, Outcome.failure("oom", "x"), None)
    p = best_payload(storage, rec)
    assert p["trial"] == 1 and p["study"] == "tiny-gpt-cpu"
    assert p["objective"] == {"metric": "tflops_per_gpu", "direction": "maximize", "value": 3.5}
    assert p["params"] == BEST
    assert p["metrics"]["tflops_per_gpu"] == 3.5 and p["metrics"]["peak_reserved_gib"] is None
    assert p["source"] == "measured" and p["hardware"]["device"] == "cpu"


@pytest.fixture
def best(storage: Storage) -> tuple[dict, SearchSpace]:
    rec = study(storage)
    finish(storage, rec, BEST, ok(3.5), 3.5)
    return best_payload(storage, rec), best_space(storage, rec)


def test_json_and_yaml_round_trip(best: tuple[dict, SearchSpace]) -> None:
    payload, space = best
    assert json.loads(render_best(payload, "json", space, export_text)) == payload
    assert yaml.safe_load(render_best(payload, "yaml", space, export_text)) == payload


def test_launcher_formats_are_the_targets_own_flags(best: tuple[dict, SearchSpace]) -> None:
    payload, space = best
    assert render_best(payload, "megatron", space, export_text) == (
        "--tensor-model-parallel-size 2 --micro-batch-size 4 --recompute-granularity full "
        "--recompute-method uniform --recompute-num-layers 1 --transformer-impl local "
        "--attention-backend unfused --use-distributed-optimizer"
    )
    bridge = render_best(payload, "bridge", space, export_text).split()
    assert bridge[:2] == ["model.tensor_model_parallel_size=2", "train.micro_batch_size=4"]
    assert "ddp.use_distributed_optimizer=true" in bridge
    nemo = render_best(payload, "nemo", space, export_text).splitlines()
    assert nemo[0] == "export NEMO_LOG_MEMORY_USAGE=1"  # what the NeMo launcher runs with
    assert nemo[1].split()[:2] == [
        "trainer.strategy.tensor_model_parallel_size=2", "data.micro_batch_size=4"
    ]  # fmt: skip
    for fmt, target in EXPORT_TARGETS.items():  # one renderer: the launcher plugin's table
        assert render_best(payload, fmt, space, export_text) == (
            launch_flags(space, payload["params"], target).text()
        )


def test_every_format_renders_and_an_unknown_one_is_refused(
    best: tuple[dict, SearchSpace],
) -> None:
    payload, space = best
    for fmt in BEST_FORMATS:
        assert render_best(payload, fmt, space, export_text).strip()
    with pytest.raises(ValueError, match="unknown format 'toml'; known formats: json, yaml"):
        render_best(payload, "toml", space, export_text)  # type: ignore[arg-type]


def _space(**model: Any) -> SearchSpace:
    data = yaml.safe_load(SPACE.read_text())
    data["model"].update(model)
    data["env"] = {
        "fixed": {"NCCL_DEBUG": "WARN", "NVTE_FWD_LAYERNORM_SM_MARGIN": 16},
        "knobs": {"CUDA_DEVICE_MAX_CONNECTIONS": {"values": [1, 32], "baseline": 32}},
    }
    return parse_space(data, "export")


def _megatron(space: SearchSpace, **params: Any) -> str:
    full = space.full_params({**space.baseline(), **params})
    return render_best({"params": full}, "megatron", space, export_text)


def test_the_environment_goes_out_as_export_lines_before_the_flags() -> None:
    space = _space()
    lines = _megatron(space).splitlines()
    assert lines[:3] == [
        "export CUDA_DEVICE_MAX_CONNECTIONS=32",
        "export NCCL_DEBUG=WARN",
        "export NVTE_FWD_LAYERNORM_SM_MARGIN=16",
    ]
    assert lines[3].startswith("--tensor-model-parallel-size 1")
    for fmt in ("bridge", "nemo"):
        text = render_best({"params": space.full_params(space.baseline())}, fmt, space,
                           export_text)  # fmt: skip
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=32\n" in text


def test_a_value_is_shell_quoted_as_in_the_launch_command() -> None:
    data = yaml.safe_load(SPACE.read_text())
    data["env"] = {"fixed": {"NCCL_SOCKET_IFNAME": "eth0 eth1"}}
    space = parse_space(data, "export")
    text = _megatron(space)
    assert text.splitlines()[0] == "export NCCL_SOCKET_IFNAME='eth0 eth1'"
    assert shlex.split(text.splitlines()[0]) == ["export", "NCCL_SOCKET_IFNAME=eth0 eth1"]


def test_megatron_lm_names_of_the_trial_not_of_a_second_table() -> None:
    # a GELU model: the bias-activation fusion flag is GELU's, not SwiGLU's
    gelu = _space(activation="gelu")
    assert "--no-bias-gelu-fusion" in _megatron(gelu, bias_activation_fusion=False).split()
    assert "--no-bias-swiglu-fusion" in _megatron(_space(), bias_activation_fusion=False).split()
    # Megatron-LM's gradient-reduction flags
    assert "--accumulate-allreduce-grads-in-fp32" in _megatron(gelu, grad_reduce_in_fp32=True)
    assert "--grad-reduce-in-bf16" in _megatron(gelu, grad_reduce_in_fp32=False)


def test_the_flex_dispatchers_deepep_backend_is_megatron_lms_switch() -> None:
    moe = load_space(EXAMPLES / "qwen3_30b_a3b.yaml")
    params = {**moe.full_params(moe.baseline()), "moe_flex_dispatcher_backend": "deepep"}
    args = render_best({"params": params}, "megatron", moe, export_text).splitlines()[-1]
    assert "--moe-enable-deepep" in args.split()
    assert "--moe-flex-dispatcher-backend" not in args
    params["moe_token_dispatcher_type"] = "alltoall"  # the backend is inactive: nothing
    args = render_best({"params": params}, "megatron", moe, export_text).splitlines()[-1]
    assert "deepep" not in args and "--moe-token-dispatcher-type alltoall" in args


@pytest.mark.parametrize(
    ("params", "fmt", "words"),
    [
        ({"attention_backend": "sdpa"}, "megatron",
         ["attention_backend='sdpa' has no Megatron-LM equivalent", "use flash/fused/te"]),
        ({"attention_backend": "sdpa"}, "bridge",
         ["attention_backend='sdpa' has no Megatron-Bridge equivalent", "use flash/fused/te"]),
        ({"fp8": "hybrid"}, "megatron",
         ["fp8='hybrid' has no Megatron-LM equivalent", "model.fp8"]),
    ],
)  # fmt: skip
def test_a_value_the_target_cannot_express_is_refused_by_name(
    params: dict, fmt: str, words: list[str]
) -> None:
    space = _space()
    with pytest.raises(NoEquivalentError) as e:
        _megatron(space, **params) if fmt == "megatron" else render_best(
            {"params": space.full_params({**space.baseline(), **params})}, fmt, space,
            export_text,
        )  # fmt: skip
    knob, value = next(iter(params.items()))
    assert (e.value.knob, e.value.value) == (knob, value)
    for w in words:
        assert w in str(e.value)


def test_dse_best_refuses_a_format_that_cannot_express_the_best(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    with open_storage(url) as st:
        rec = study(st)
        finish(st, rec, {**BEST, "attention_backend": "sdpa"}, ok(3.5), 3.5)
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["best", "--storage", url, "--format", "megatron"])
    assert rc == 1 and out.getvalue() == ""
    assert "attention_backend='sdpa' has no Megatron-LM equivalent" in err.getvalue()
    assert "use flash/fused/te" in err.getvalue()
    with redirect_stdout(out):
        assert main(["best", "--storage", url, "--format", "json"]) == 0


def test_each_target_names_the_fields_its_own_way() -> None:
    space = _space(num_layers=16)
    params = space.full_params({
        **space.baseline(), "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2, "micro_batch_size": 4,
        "recompute": "selective", "use_distributed_optimizer": True,
        "bias_activation_fusion": False, "overlap_grad_reduce": True,
    })  # fmt: skip

    def words(fmt: str) -> list[str]:
        return render_best({"params": params}, fmt, space, export_text).splitlines()[-1].split()

    m = " ".join(words("megatron"))
    for flag in ("--tensor-model-parallel-size 2", "--micro-batch-size 4",
                 "--num-layers-per-virtual-pipeline-stage 4",  # 16 layers / (PP 2 x VPP 2)
                 "--recompute-granularity selective", "--use-distributed-optimizer",
                 "--no-bias-swiglu-fusion", "--overlap-grad-reduce"):  # fmt: skip
        assert flag in m, flag
    b = words("bridge")
    for item in (
        "model.tensor_model_parallel_size=2",
        "train.micro_batch_size=4",
        "ddp.overlap_grad_reduce=true",
        "optimizer.use_distributed_optimizer=true",
    ):
        assert item in b, item
    n = words("nemo")
    for item in ("trainer.strategy.tensor_model_parallel_size=2", "data.micro_batch_size=4",
                 "model.config.recompute_granularity=selective",
                 "trainer.strategy.ddp.overlap_grad_reduce=True",
                 "optim.config.use_distributed_optimizer=True"):  # fmt: skip
        assert item in n, item
