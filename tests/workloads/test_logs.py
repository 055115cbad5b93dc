"""Recipe log parsers on real log lines (tests/fixtures/logs, each file naming its source)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dse.cli.main import main
from dse.model.flops import model_flops_per_step
from dse.runners import classify_log as runner_classify_log
from dse.workloads.logs import classify_failure, classify_log, detect_format, parse_log
from tests.conftest import EXAMPLES, LOGS


def _text(name: str) -> str:
    return (LOGS / name).read_text()


def test_megatron_lm_iteration_lines_read_as_a_person_reads_them() -> None:
    p = parse_log(_text("megatron_mixtral_16xh100.log"))
    assert p.format == "megatron"
    assert [s.step for s in p.steps] == [71, 72, 73]
    assert [s.step_time_s for s in p.steps] == pytest.approx([5.3616, 5.4707, 5.8299])
    assert [s.tflops_per_gpu for s in p.steps] == [243.6, 238.7, 224.0]
    assert [s.loss for s in p.steps] == [1.818812, 1.820313, 1.798953]
    assert [s.grad_norm for s in p.steps] == [1.3, 1.305, 1.539]
    out = p.summary(warmup_steps=1)
    assert out["step_time_s"] == pytest.approx(5.4707)  # median of the three
    # the log's own figure is kept beside dse's, never as the objective (one FLOP definition)
    assert out["tflops_per_gpu"] is None and out["tflops_source"] is None
    assert out["tflops_per_gpu_log"] == pytest.approx(238.7)
    assert "throughput per GPU" in out["tflops_log_source"]
    assert out["steps"] == 73 and out["logged_steps"] == 3 and out["failure"] is None


def test_warm_up_iterations_are_excluded_by_iteration_number() -> None:
    p = parse_log(_text("megatron_mixtral_16xh100.log"))
    # iterations <= 72 are warm-up: only iteration 73 is steady state
    out = p.summary(warmup_steps=72)
    assert out["step_time_s"] == pytest.approx(5.8299)
    assert out["tflops_per_gpu_log"] == pytest.approx(224.0)
    assert out["loss"] == [1.818812, 1.820313, 1.798953]  # every logged loss is kept


def test_logging_every_n_iterations() -> None:
    lines = _text("megatron_mixtral_16xh100.log").splitlines()
    every_other = "\n".join(ln for ln in lines if "iteration       72/" not in ln)
    p = parse_log(every_other)
    assert [s.step for s in p.steps] == [71, 73]
    assert p.log_interval == 2


def test_several_ranks_print_the_same_iteration_once_counted() -> None:
    lines = [ln for ln in _text("megatron_mixtral_16xh100.log").splitlines() if "iteration" in ln]
    interleaved = "\n".join(
        [f"0: {lines[0]}", f"1: {lines[0]}", "1: [W] some warning of rank 1", f"0: {lines[1]}",
         f"1: {lines[1]}", f"[rank1]: {lines[2]}", f"[rank0]: {lines[2]}"]
    )  # fmt: skip
    p = parse_log(interleaved)
    assert [s.step for s in p.steps] == [71, 72, 73]
    assert p.summary()["tflops_per_gpu_log"] == pytest.approx(238.7)


def test_no_throughput_in_the_log_tflops_computed_with_dse_flops_and_said_so() -> None:
    p = parse_log(_text("megatron_no_throughput.log"))
    assert [s.step_time_s for s in p.steps] == pytest.approx([86.5452, 87.8716, 89.4748, 89.0752])
    assert p.summary()["tflops_per_gpu"] is None and p.summary()["tflops_per_gpu_log"] is None
    assert "TFLOP/s needs the model" in p.summary()["notes"][0]
    model = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
             "ffn_hidden_size": 11008, "vocab_size": 32000}  # fmt: skip
    sem = {"global_batch_size": 1024, "seq_length": 4096}
    flops = model_flops_per_step(model, sem)
    out = p.summary(warmup_steps=1, flops_per_step=flops, world_size=64)
    median = (87.8716 + 89.0752) / 2  # median of four
    assert out["step_time_s"] == pytest.approx(median)
    assert out["tflops_per_gpu"] == pytest.approx(flops / (median * 64 * 1e12))
    assert out["tflops_source"] == "computed"


def test_bridge_log_step_time_line_and_memory_in_gigabytes() -> None:
    text = _text("bridge_evo2.log")
    assert detect_format(text) == "bridge"
    p = parse_log(text)
    assert p.format == "bridge"
    (s,) = p.steps
    assert s.step == 1 and s.step_time_s == pytest.approx(7.0373)
    assert s.tflops_per_gpu == pytest.approx(24.7)  # from the "Step Time :" line before it
    assert s.loss == pytest.approx(6.700717)
    assert p.peak_mem_gib == pytest.approx(13.367e9 / 2**30)  # Bridge's GB are 1e9 bytes
    assert p.peak_reserved_gib is None  # the excerpt ends before mem-max-reserved


def test_nemo_progress_lines_zero_based_iterations() -> None:
    text = _text("nemo_bionemo_esm2.log")
    assert detect_format(text) == "nemo"
    p = parse_log(text)
    assert [s.step for s in p.steps] == [121, 122, 123, 124, 125, 126]
    assert [s.loss for s in p.steps] == [1.233, 1.288, 1.333, 1.245, 1.375, 1.34]
    assert p.summary()["step_time_s"] == pytest.approx((0.03157 + 0.03163) / 2)
    assert p.total_steps == 149


def test_nemo_memory_and_tflops_fields() -> None:
    # The field names NeMo's progress bar prints with TFLOPS and NEMO_LOG_MEMORY_USAGE on
    line = (
        "Training epoch 0, iteration 9/99 | lr: 1.5e-06 | global_step: 9 | "
        "peak_memory_usage: 60129542144 | memory_allocated: 39393640448 | "
        "reduced_train_loss: 11.03 | train_step_timing in s: 2.385 | TFLOPS_per_GPU: 479.2"
    )
    p = parse_log(line, "nemo")
    assert p.steps[0].tflops_per_gpu == pytest.approx(479.2)
    assert p.peak_mem_gib == pytest.approx(60129542144 / 2**30)


@pytest.mark.parametrize(
    ("name", "cls", "words"),
    [
        ("cuda_oom.log", "oom", "Tried to allocate 172.00 MiB"),
        ("nccl_timeout_ranks.log", "hang", "Watchdog caught collective operation timeout"),
    ],
)
def test_failures_classified_from_real_logs(name: str, cls: str, words: str) -> None:
    found = classify_failure(_text(name))
    assert found is not None and found[0] == cls and words in found[1]
    assert classify_log(_text(name)) == cls == runner_classify_log(_text(name))


@pytest.mark.parametrize(
    ("text", "cls", "msg"),
    [
        (
            'Traceback (most recent call last):\n  File "pretrain_gpt.py", line 9, in <module>\n'
            "AssertionError: num_attention_heads must be divisible by tensor_model_parallel_size",
            "invalid",
            "num_attention_heads must be divisible by tensor_model_parallel_size",
        ),
        (
            '  File "/opt/Megatron-Bridge/src/megatron/bridge/training/config.py", line 1575, '
            "in validate\nValueError: seq_length must be divisible by 2 * context_parallel_size",
            "invalid",
            "seq_length must be divisible by 2 * context_parallel_size",
        ),
        ("pretrain_gpt.py: error: unrecognized arguments: --foo 1", "invalid", "--foo 1"),
        ("ValueError: some runtime value problem", None, None),
        ("iteration 3/ 10 | number of nan iterations:   1 |", "nan", "nan iterations"),
        ("iteration 3/ 10 | number of nan iterations:   0 |", None, None),
        ("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", "error", "NCCL"),
    ],
)
def test_failure_classes(text: str, cls: str | None, msg: str | None) -> None:
    found = classify_failure(text)
    if cls is None:
        assert found is None
    else:
        assert found is not None and found[0] == cls and msg in found[1]


def test_parse_log_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse-log", str(LOGS / "megatron_mixtral_16xh100.log"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tflops_per_gpu"] is None  # no space file: dse cannot count the model's FLOPs
    assert out["tflops_per_gpu_log"] == pytest.approx(238.7)
    assert out["step_time_s"] == pytest.approx(5.4707)
    assert out["loss"] == [1.818812, 1.820313, 1.798953]
    assert out["steps"] == 73 and out["failure"] is None and out["peak_mem_gib"] is None


def test_parse_log_cli_text_with_space_computes_tflops(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["parse-log", str(LOGS / "nemo_bionemo_esm2.log"), "--format", "nemo",
               "--space", str(EXAMPLES / "tiny_gpt_cpu.yaml")])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "format:         nemo" in out and "(computed)" in out
    assert "loss:           [1.233, 1.288, 1.333, 1.245, 1.375, 1.34]" in out
    tf = float(out.split("tflops_per_gpu: ")[1].split()[0])
    assert math.isfinite(tf) and tf > 0


def test_parse_log_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse-log", str(tmp_path / "missing.log")]) == 2
    assert "cannot read the log" in capsys.readouterr().err
    empty = tmp_path / "x.log"
    empty.write_text("hello\nworld\n")
    assert main(["parse-log", str(empty)]) == 2
    assert "no iteration line of the megatron format" in capsys.readouterr().err
    assert main(["parse-log", str(empty), "--format", "deepspeed"]) == 2


def test_megatron_lm_memory_report_in_mib_max_over_ranks() -> None:
    # Megatron-LM's report_memory (megatron/training/utils.py) prints one line per DP-rank-0
    # rank, in MiB; the peak is the largest "max allocated" of them.
    text = "\n".join(
        [
            "[Rank 0] (after 2 iterations) memory (MB) | allocated: 100.5 | max allocated: "
            "61440.0 | reserved: 70000.0 | max reserved: 71680.0",
            "[Rank 4] (after 2 iterations) memory (MB) | allocated: 100.5 | max allocated: "
            "65536.0 | reserved: 70000.0 | max reserved: 70144.0",
        ]
    )
    p = parse_log(text, "megatron")
    assert p.peak_mem_gib == pytest.approx(64.0)
    assert p.peak_reserved_gib == pytest.approx(70.0)


def test_nemo_lightning_progress_bar() -> None:
    p = parse_log(_text("nemo1_progress.log"))
    assert p.format == "nemo"
    (s,) = p.steps
    assert s.step == 795 and s.loss == pytest.approx(3.09) and s.step_time_s is None
    assert p.total_steps == 77225 and p.failure is None


def test_nan_loss_of_a_real_nemo_log() -> None:
    p = parse_log(_text("nemo1_progress_nan.log"))
    (s,) = p.steps
    assert s.step == 9001 and s.step_time_s == pytest.approx(0.615)
    assert p.failure is not None and p.failure[0] == "nan"
    assert "reduced_train_loss=nan.0" in p.failure[1]
    out = p.summary()
    assert out["loss"] == [None] and out["failure"]["class"] == "nan"
    json.dumps(out, allow_nan=False)  # what --json prints is valid JSON


def test_nan_loss_recorded_as_nan_by_the_trial_process(tmp_path: Path) -> None:
    from dse.core.records import MetricsWriter, TrialSpec, read_metrics
    from dse.workloads.launchers.run import run_rendered

    spec = TrialSpec(
        study="s", trial_number=0, params={}, world_size=8, device="cuda",
        model={"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
               "ffn_hidden_size": 128, "vocab_size": 1000},
        semantics={"global_batch_size": 8, "seq_length": 64, "steps": 4, "warmup_steps": 1},
        metrics_path=str(tmp_path / "m.jsonl"),
        workload={"rendered": {"argv": ["cat", str(LOGS / "nemo1_progress_nan.log")],
                               "env": {}, "log_format": "nemo"}},
    )  # fmt: skip
    import io

    assert run_rendered(spec, MetricsWriter(spec.metrics_path), io.StringIO()) == 3
    o = read_metrics(spec.metrics_path)
    assert o is not None and o.failure_class == "nan"


# --- issue items 5 and 6 on real NeMo 2.0 / Megatron-Bridge console logs ------------------

#: Llama 3 8B as NeMo's llama3_8b recipe builds it (32 layers, GQA 8, SwiGLU 14336, vocab 128256).
LLAMA3_8B = {
    "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
    "ffn_hidden_size": 14336, "vocab_size": 128256, "activation": "swiglu",
}  # fmt: skip


def test_nemo2_memory_fields_in_bytes_of_a_real_log() -> None:
    """NeMo 2.0 prints max_memory_allocated / max_memory_reserved (bytes) with
    NEMO_LOG_MEMORY_USAGE=1; the allocated peak is the peak memory, the reserved the reserved."""
    p = parse_log(_text("nemo2_llama3_8b_memory.log"))
    assert p.format == "nemo"
    assert [s.step for s in p.steps] == [75, 76, 77]  # 0-based iterations 74..76
    assert [s.step_time_s for s in p.steps] == pytest.approx([8.768, 8.748, 8.756])
    assert [s.loss for s in p.steps] == [11.87, 11.87, 11.87]
    assert [s.tflops_per_gpu for s in p.steps] == [865.7, 867.7, 866.9]
    assert p.peak_mem_gib == pytest.approx(62777982976 / 2**30)  # 58.47 GiB
    assert p.peak_reserved_gib == pytest.approx(64286097408 / 2**30)  # 59.87 GiB


def test_nemo2_tflops_is_dse_model_flops_over_the_step_time_log_figure_beside_it() -> None:
    """One FLOP definition: NeMo's TFLOPS_per_GPU counts causal attention in full; dse's
    objective is its own model FLOPs over the measured step time, the log's figure is kept
    as tflops_per_gpu_log with its source and is never the objective."""
    p = parse_log(_text("nemo2_llama3_8b_memory.log"))
    flops = model_flops_per_step(LLAMA3_8B, {"global_batch_size": 128, "seq_length": 8192})
    out = p.summary(warmup_steps=0, flops_per_step=flops, world_size=8)
    assert out["step_time_s"] == pytest.approx(8.756)
    assert out["tflops_source"] == "computed"
    assert out["tflops_per_gpu"] == pytest.approx(flops / (8.756 * 8 * 1e12))
    assert out["tflops_per_gpu_log"] == pytest.approx(866.9)
    assert "TFLOPS_per_GPU" in out["tflops_log_source"]
    # NeMo's figure is ~12% above Megatron's causal count on this step (issue: 866.9 vs 770.5)
    assert 1.08 < out["tflops_per_gpu_log"] / out["tflops_per_gpu"] < 1.17


def test_bridge_02_log_with_tflops_line_and_memory_in_mb() -> None:
    """A Megatron-Bridge 0.2 console log: 'Step Time : 4.65s GPU utilization:
    59892.5TFLOP/s/GPU' (no MODEL_ prefix), the iteration line, memory in MB."""
    text = _text("bridge_llama32_1b_h100.log")
    assert detect_format(text) == "bridge"
    p = parse_log(text)
    (s,) = p.steps
    assert s.step == 10 and s.step_time_s == pytest.approx(4.6478)
    assert s.loss == pytest.approx(9.763827) and s.grad_norm == pytest.approx(33.055)
    assert s.tflops_per_gpu == pytest.approx(59892.5)  # what the log says, kept as the log's
    assert p.peak_mem_gib == pytest.approx(12003.60400390625 / 1024)
    assert p.peak_reserved_gib == pytest.approx(12232.0 / 1024)
    out = p.summary(warmup_steps=0)
    assert out["tflops_per_gpu_log"] == pytest.approx(59892.5) and out["tflops_per_gpu"] is None


def test_upstream_megatron_lms_second_line_is_its_own_iteration() -> None:
    """Upstream Megatron-LM (core_v0.16.1) logs iteration 1 without resetting its
    accumulators: its iteration-2 line prints the means of iterations 1 and 2. The parser
    gives iteration 2's own loss and time (the built-in trainer, fed the same batches from
    the same weights, measured 6.930691 at step 2; the timestamps of the lines 2.019 s)."""
    text = (LOGS / "megatron_lm_v0161_cpu_tiny_gpt_mbs1.log").read_text()
    assert "lm loss: 6.942011E+00" in text  # printed: (6.953331 + 6.930691) / 2
    parsed = parse_log(text)
    assert [s.step for s in parsed.steps] == [1, 2, 3, 4]
    assert [round(s.loss, 6) for s in parsed.steps] == [6.953331, 6.930691, 6.896733, 6.861097]
    assert parsed.steps[1].step_time_s == pytest.approx(2 * 1.1284 - 0.2381)
    assert any("iteration 2" in n for n in parsed.notes)
    # without upstream's argument table (the built-in trainer's Megatron-LM lines) nothing
    # is corrected
    lines = [x for x in text.splitlines() if " iteration " in x]
    plain = parse_log("\n".join(lines))
    assert plain.steps[1].loss == 6.942011 and not plain.notes
