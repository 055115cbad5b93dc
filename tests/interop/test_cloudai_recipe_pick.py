"""``dse cloudai import`` of a MegatronBridge test runs the recipe CloudAI's launcher builds
(Megatron-Bridge's performance launcher: model_recipe_name, task, gpu_type, num_gpus,
compute_dtype), with that recipe's own parallel layout as the study's baseline; a test no
recipe matches exits 2 naming what is missing; the recipe names and repository pins a test
writes survive export -> re-import unchanged. On every current upstream CloudAI
MegatronBridge test at hand (tests/fixtures/cloudai_current)."""

from __future__ import annotations

import tomllib
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
import yaml

from dse.cli.main import main
from dse.interop.cloudai import BRIDGE_KNOBS, dump_toml, export_test_full, import_scenario
from dse.space.catalog.bridge_recipes import recipe_defaults
from dse.space.searchspace import parse_space_text

CURRENT = Path(__file__).resolve().parents[1] / "fixtures" / "cloudai_current"
TESTS = CURRENT / "test"
BRIDGE_TESTS = sorted(
    p for p in TESTS.glob("*.toml") if "MegatronBridge" in p.read_text()
)  # fmt: skip


def _import(path: Path, **kw: object) -> tuple[dict, object]:
    got = import_scenario(path, tests_dir=TESTS, **kw)  # type: ignore[arg-type]
    text = got.to_yaml(path.name)
    return got.space, parse_space_text(text, path.name)


@pytest.mark.parametrize("path", BRIDGE_TESTS, ids=lambda p: p.stem)
def test_the_recipe_is_the_one_cloudais_launcher_builds(path: Path) -> None:
    raw = tomllib.loads(path.read_text())
    args = raw["cmd_args"]
    raw_space, space = _import(path)
    dtype = args.get("compute_dtype", "bf16")
    dtypes = dtype if isinstance(dtype, list) else [dtype]
    # the older schema names the recipe by model_name + model_size (deepseek + v3)
    name = args.get("model_recipe_name") or f"{args['model_name']}_{args['model_size']}"
    want = recipe_defaults(
        name, args.get("task", "pretrain"),
        gpu=args.get("gpu_type", "gb200"), compute_dtype=str(dtypes[0]),
        num_gpus=int(args.get("num_gpus", 8)),
    )  # fmt: skip
    assert want is not None
    if len(dtypes) == 1:
        assert space.workload.launcher.recipe == want.name
    # the recipe's own layout, where the test leaves it to the recipe
    base = space.full_params(space.baseline())
    given = {BRIDGE_KNOBS.get(k, k) for k in args}  # the knobs the test sets itself
    if "recompute_modules" in args:  # CloudAI's list sets both recompute knobs
        given.add("recompute")
    for f, v in want.layout.items():
        knob = "recompute" if f == "recompute_granularity" else f
        if knob in given or knob in ("moe_flex_dispatcher_backend", "sequence_parallel"):
            continue
        if knob == "recompute":
            v = "none" if v is None else v
        if knob in base and knob not in space.derived:
            assert base[knob] == v, (knob, base[knob], v)


def test_qwen3_30b_runs_bridges_ep16_layout_and_fits() -> None:
    """The 16x H100 FP8 Qwen3-30B test: the fp8cs performance recipe, EP 16 (not EP 1, which
    the memory model predicted at 260-281 GiB), and its baseline passes the pre-screen."""
    path = TESTS / "megatron_bridge_qwen_30b.toml"
    _raw, space = _import(path)
    assert space.workload.launcher.recipe == "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config"
    base = space.full_params(space.baseline())
    assert base["expert_model_parallel_size"] == 16
    assert base["tensor_model_parallel_size"] == 1
    from dse.model.costmodel import CostModel

    assert base["grad_reduce_in_fp32"] is False  # the performance recipes' bf16 reduction
    cm = CostModel(space.model, space.semantics, space.resources)
    fits, pred = cm.fits(base, 0.0)  # no margin: what the sim workload holds it to
    assert fits, pred  # an estimate: the predicted GiB


def test_a_test_no_recipe_matches_exits_2_naming_what_is_missing(tmp_path: Path) -> None:
    text = (TESTS / "megatron_bridge_qwen_30b.toml").read_text()
    bad = text.replace('model_recipe_name = "qwen3_30b_a3b"', 'model_recipe_name = "qwen9_1t"')
    p = tmp_path / "t.toml"
    p.write_text(bad)
    space_file = tmp_path / "model.yaml"  # a model section, so the recipe decides
    space_file.write_text(yaml.safe_dump({"model": {"catalog": "qwen3_30b_a3b"}}))
    err = StringIO()
    with redirect_stdout(StringIO()), redirect_stderr(err):
        rc = main(["cloudai", "import", str(p), "--model-from", str(space_file)])
    assert rc == 2
    msg = err.getvalue()
    for part in ("qwen9_1t", "'pretrain'", "'h100'", "16", "fp8_cs", "no Megatron-Bridge recipe"):
        assert part in msg, part


@pytest.mark.parametrize(
    "name",
    ["megatron_bridge_nemotron_nano_pytorch_profiler.toml", "megatron_bridge_qwen_30b.toml",
     "nemo_run_llama3_8b.toml"],
)  # fmt: skip
def test_pins_mounts_and_recipe_names_survive_the_round_trip(name: str, tmp_path: Path) -> None:
    path = TESTS / name
    raw = tomllib.loads(path.read_text())
    _raw, space = _import(path, seq_length=8192, global_batch_size=64)
    got = export_test_full(space, space.baseline(), "rt")
    text = dump_toml(got.test)
    out = tomllib.loads(text)
    assert out.get("git_repos", []) == raw.get("git_repos", out.get("git_repos", []))
    for k in ("recipe_name", "model_family_name", "model_recipe_name"):
        if k in raw["cmd_args"]:
            assert out["cmd_args"][k] == raw["cmd_args"][k]
    for repo in raw.get("git_repos", []):  # byte for byte in the TOML written
        assert f'commit = "{repo["commit"]}"' in text
        if "mount_as" in repo:
            assert f'mount_as = "{repo["mount_as"]}"' in text
        if "init_submodules" in repo:
            assert f"init_submodules = {str(repo['init_submodules']).lower()}" in text
    # ... and back: the re-imported space names the same recipe and keeps the same pins
    p = tmp_path / "rt.toml"
    p.write_text(text)
    _raw2, again = _import(p, seq_length=8192, global_batch_size=64)
    assert again.workload.launcher.recipe == space.workload.launcher.recipe
    assert again.workload.launcher.cloudai == space.workload.launcher.cloudai
    if "nemo_run" in name:
        assert raw["cmd_args"]["recipe_name"] == "cloudai_llama3_8b_recipe"
        assert out["cmd_args"]["recipe_name"] == "cloudai_llama3_8b_recipe"


@pytest.mark.parametrize(
    ("recipe", "seq", "gbs", "tp"),
    [("llama3_8b", 8192, 512, 1), ("llama3_70b", 8192, 512, 4), ("nemotron4_15b", 4096, 32, 4),
     ("nemotron3_8b", 4096, 32, 2), ("nemotron4_340b", 4096, 2304, 8)],
)  # fmt: skip
def test_a_nemorun_test_leaving_batch_and_sequence_to_its_recipe_takes_nemos_defaults(
    tmp_path: Path, recipe: str, seq: int, gbs: int, tp: int
) -> None:
    """NeMo 2.0's own recipe defaults (dse/space/catalog/nemo_recipe_defaults.yaml, NeMo
    v2.4.0's pretrain_recipe) stand in for what a NeMoRun test leaves out, named in a note;
    the recipe's own TP is the baseline where the test leaves it."""
    text = (TESTS / "nemo_run_llama3_8b.toml").read_text()
    lines = [
        ln for ln in text.splitlines()
        if ln.strip().split(" ")[0] not in ("seq_length", "global_batch_size",
                                            "tensor_model_parallel_size")
    ]  # fmt: skip
    body = "\n".join(lines).replace("cloudai_llama3_8b_recipe", f"cloudai_{recipe}_recipe")
    p = tmp_path / "t.toml"
    p.write_text(body + "\n")
    model = None if recipe.startswith("llama3_8") else _model(tmp_path)
    got = import_scenario(p, model_from=model)
    sem = got.space["semantics"]
    assert (sem["seq_length"], sem["global_batch_size"]) == (seq, gbs)
    note = next(n for n in got.notes if "recipe's defaults" in n)
    assert f"NeMo v2.4.0 (2381f42f6979) nemo/collections/llm/recipes/{recipe}.py" in note
    space = parse_space_text(got.to_yaml("t"), "t")
    assert space.full_params(space.baseline())["tensor_model_parallel_size"] == tp


def _model(tmp_path: Path) -> Path:
    f = tmp_path / "model.yaml"  # a model section (the recipe's model is not what is tested)
    f.write_text(yaml.safe_dump({"model": {"catalog": "llama3_8b"}}))
    return f


@pytest.mark.parametrize("gpu", ["b200", "gb200", "gb300"])
def test_the_8_gpu_blackwell_qwen3_30b_tests_fit(gpu: str) -> None:
    """CloudAI's 8-GPU Blackwell Qwen3-30B tests (fp8_mx): each runs its own recipe, its GPU is
    in the GPU table (a memory check runs: GB300 had none) and the recipe's own baseline is
    no predicted OOM (B200 was one: 221.95 GiB of 177.12, the MoE layers counted twice)."""
    from dse.model.costmodel import CostModel

    _raw, space = _import(TESTS / f"megatron_bridge_qwen_30b_{gpu}.toml")
    assert space.workload.launcher.recipe == f"qwen3_30b_a3b_pretrain_8gpu_{gpu}_fp8mx_config"
    assert space.resources.gpu_memory_gib, "no GPU memory: the GPU is not in dse's table"
    base = space.full_params(space.baseline())
    cm = CostModel(space.model, space.semantics, space.resources)
    fits, pred = cm.fits(base, 0.0)
    assert fits, pred  # an estimate: the predicted GiB


DEEPSEEK_TESTS = [
    CURRENT / "test_scenario" / "megatron_bridge_deepseekv3_bayesian.toml",  # current schema
    CURRENT / "test_scenario" / "megatron_bridge_standalone_deepseekv3.toml",  # model_name/size
]


@pytest.mark.parametrize("path", DEEPSEEK_TESTS, ids=lambda p: p.stem)
def test_deepseek_v3_baseline_is_the_recipes_own_layout_with_bridges_pipeline_layout(
    path: Path, tmp_path: Path
) -> None:
    """The DeepSeek-V3 sweep tests leave their layout to the recipe (TP 1, PP 4, VP 4, EP 64,
    deepseek_v3_pretrain_256gpu_gb200_fp8cs_config). Bridge's DeepSeek-V3 recipes set
    pipeline_model_parallel_layout from (PP, VP), so the import derives it
    (bridge_deepseek_v3): the baseline stays the recipe's own, passes the rules and
    ``dse validate``, and a sim dry-run of it is no predicted OOM (the recipe NVIDIA ships).
    No value the study fixes differs from the recipe's."""
    from dse.model.costmodel import CostModel
    from dse.model.rules import check

    got = import_scenario(path, tests_dir=TESTS, seq_length=4096)
    assert got.space["derived"]["pipeline_model_parallel_layout"] == "bridge_deepseek_v3"
    space = parse_space_text(got.to_yaml(path.name), path.name)
    recipe = recipe_defaults("deepseek_v3", "pretrain", gpu="gb200", compute_dtype="fp8_cs",
                             num_gpus=256)  # fmt: skip
    assert recipe is not None and space.workload.launcher.recipe == recipe.name
    own = recipe.layout
    base = space.baseline()
    sizes = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
             "virtual_pipeline_model_parallel_size", "expert_model_parallel_size")  # fmt: skip
    for knob in sizes:
        assert base[knob] == own[knob], knob
    assert (base["pipeline_model_parallel_size"], base["virtual_pipeline_model_parallel_size"],
            base["expert_model_parallel_size"]) == (4, 4, 64)  # fmt: skip
    full = space.full_params(base)
    assert full["pipeline_model_parallel_layout"] == "Et*4|(t*4|)*14tL"  # Bridge's (4, 4)
    assert space.fixed["fp8_param"] is True  # the fp8_cs preset's fp8_param_gather
    assert not check(space, full, space.resources.features)  # type: ignore[arg-type]
    assert not any("breaks a dse rule" in n for n in got.notes)  # the baseline did not move
    note = next(n for n in got.notes if n.startswith("the baseline ("))
    assert "pipeline_model_parallel_size 4" in note and "'Et*4|(t*4|)*14tL'" in note
    assert any("bridge_deepseek_v3" in n and recipe.name in n for n in got.notes)
    for knob in ("context_parallel_size", "expert_tensor_parallel_size", "micro_batch_size",
                 "grad_reduce_in_fp32", "cross_entropy_fusion_impl"):  # fmt: skip
        assert space.fixed[knob] == own[knob], knob  # the values the study fixes stay the recipe's
    # dse validate: the space and its baseline pass (exit 0)
    f = tmp_path / "ds.yaml"
    f.write_text(got.to_yaml(path.name))
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["validate", str(f)])
    assert rc == 0, err.getvalue()
    assert 'pipeline_model_parallel_size": 4' in out.getvalue()
    # the sim workload's check (dse.workloads.sim): no predicted OOM of the recipe's layout
    cm = CostModel(space.model, space.semantics, space.resources)
    fits, need = cm.fits(full, 0.0)
    assert fits, need  # an estimate: GiB needed per GPU
    # the Bridge launcher passes the derived layout on; at PP 1 it clears the recipe's own
    from dse.workloads.launchers import launcher_for

    launcher = launcher_for(space)
    pp1 = {**base, "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": None}
    for params, want in ((base, "Et*4|(t*4|)*14tL"), (pp1, "null")):
        argv = launcher.render(space.full_params(params)).argv
        assert f"model.pipeline_model_parallel_layout={want}" in argv


def test_without_the_layout_derivation_the_baseline_moves_the_fewest_knobs() -> None:
    """Without the recipe's pipeline layout (the derived section taken out), PP 4 splits 61
    layers unevenly, so the baseline must move: it moves the fewest knobs (PP and VP, to 1
    and None), keeps the recipe's EP 64 and TP 1 (the first valid configuration in grid
    order took EP 32 too) and names each value it changed as the recipe's own."""
    from dse.interop.cloudai.importer import _valid_baseline
    from dse.model.rules import check
    from dse.space.searchspace import parse_space

    path = DEEPSEEK_TESTS[0]
    got = import_scenario(path, tests_dir=TESTS, seq_length=4096)
    raw = got.space
    del raw["derived"]["pipeline_model_parallel_layout"]
    for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
              "virtual_pipeline_model_parallel_size", "expert_model_parallel_size"):  # fmt: skip
        raw["knobs"][k]["baseline"] = {"virtual_pipeline_model_parallel_size": 4,
                                       "pipeline_model_parallel_size": 4,
                                       "expert_model_parallel_size": 64}.get(k, 1)  # fmt: skip
    notes: list[str] = []
    recipe_values = {"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 4}
    _valid_baseline(raw, "t", notes, recipe_values)
    space = parse_space(raw, "t")
    base = space.baseline()
    assert not check(space, base, space.resources.features)  # type: ignore[arg-type]
    assert base["expert_model_parallel_size"] == 64 and base["tensor_model_parallel_size"] == 1
    assert base["pipeline_model_parallel_size"] == 1
    assert base["virtual_pipeline_model_parallel_size"] is None
    note = next(n for n in notes if "breaks a dse rule" in n)
    assert "the recipe's own pipeline_model_parallel_size 4 -> 1" in note
    assert "virtual_pipeline_model_parallel_size 4 -> None" in note
    assert "expert_model_parallel_size" not in note  # not changed


@pytest.mark.parametrize(
    ("dtype", "fp8_param"),
    [("fp8_cs", True), ("fp8_mx", True), ("fp8_ds", True), ("fp8_sc", None), ("bf16", None)],
)
def test_fp8_param_follows_bridges_mixed_precision_preset(
    dtype: str, fp8_param: bool | None, tmp_path: Path
) -> None:
    """Bridge's current-scaling, MXFP8 and delayed-scaling presets set fp8_param_gather, which
    MixedPrecisionConfig copies to fp8_param (FP8 weights: the memory model counts one byte);
    the subchannel-scaling and BF16 presets do not."""
    body = (TESTS / "megatron_bridge_qwen_30b.toml").read_text()
    f = tmp_path / "t.toml"
    f.write_text(body.replace('compute_dtype = "fp8_cs"', f'compute_dtype = "{dtype}"'))
    got = import_scenario(f)
    assert got.space["fixed"].get("fp8_param") is fp8_param
    assert any(n.startswith("fp8_param on") for n in got.notes) is bool(fp8_param)
