"""Megatron-Bridge recipes' default global batch size and sequence length
(``dse/space/catalog/bridge_recipe_defaults.yaml``, written by
``scripts/extract_bridge_recipe_defaults.py``): the recipes CloudAI's tests and dse's catalog
name are there, the lookup follows Bridge's performance launcher, and the file is what the
script extracts from Megatron-Bridge r0.6.0 head (where a copy of that source is at hand)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dse.space.catalog import catalog
from dse.space.catalog.bridge_recipes import bridge_recipe_table, recipe_defaults

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "dse" / "space" / "catalog" / "bridge_recipe_defaults.yaml"

#: dse's catalog models -> the Megatron-Bridge recipe of each (None: Bridge 0.6 has none)
CATALOG_RECIPES = {
    "deepseek_v3": "deepseek_v3_pretrain_config",
    "llama3_405b": "llama31_405b_pretrain_config",
    "llama3_70b": "llama3_70b_pretrain_config",
    "llama3_8b": "llama3_8b_pretrain_config",
    "mixtral_8x7b": None,
    "nemotron3_8b": None,
    "nemotron4_15b": None,
    "nemotron4_340b": None,
    "nemotron_3_nano_30b_a3b": "nemotron_3_nano_pretrain_config",
    "nemotron_3_nano_omni_llm": "nemotron_omni_cord_v2_sft_config",
    "nemotron_h_8b": "nemotronh_8b_pretrain_config",
    "qwen3_30b_a3b": "qwen3_30b_a3b_pretrain_config",
}

#: the recipes CloudAI's current MegatronBridge tests name (NVIDIA/cloudai 5b5c0f7, conf/ and
#: tests/fixtures/cloudai_current), with the performance recipe each test's gpu_type,
#: compute_dtype and num_gpus select
CLOUDAI_RECIPES = {
    "qwen3_30b_a3b": [
        "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config",
        "qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config",
        "qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config",
        "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config",
    ],
    "nemotron_3_nano": ["nemotron_3_nano_pretrain_8gpu_gb200_fp8mx_config"],
    "deepseek_v3": ["deepseek_v3_pretrain_256gpu_gb200_fp8cs_config"],
}


def test_the_table_names_its_source_and_every_entry_its_file() -> None:
    data = bridge_recipe_table()
    assert data["source"]["project"] == "NVIDIA-NeMo/Megatron-Bridge"
    assert data["source"]["version"] == "0.6 (r0.6.0 head)"
    assert TABLE_COMMIT in data["source"]["note"]
    assert len(data["recipes"]) > 500 and len(data["perf_recipes"]) > 400
    for section in ("recipes", "perf_recipes"):
        for name, e in data[section].items():
            assert name.endswith("_config")
            assert e["path"].startswith(f"src/megatron/bridge/{section}/"), name
            for k in ("global_batch_size", "seq_length"):
                assert e[k] is None or (isinstance(e[k], int) and e[k] > 0), name
    assert "bridge_recipe_defaults.yaml" in (REPO / "pyproject.toml").read_text()


def test_the_recipes_cloudai_and_the_catalog_name_are_there() -> None:
    data = bridge_recipe_table()
    assert set(CATALOG_RECIPES) == set(catalog())  # a new catalog model needs a decision
    for name in [r for r in CATALOG_RECIPES.values() if r] + [
        f"{stem}_pretrain_config" for stem in CLOUDAI_RECIPES
    ]:
        e = data["recipes"][name]
        assert e["global_batch_size"] and e["seq_length"], name
    for perf in CLOUDAI_RECIPES.values():
        for name in perf:
            e = data["perf_recipes"][name]
            assert e["global_batch_size"] and e["seq_length"], name
    # a few values read from the source by hand
    assert data["recipes"]["llama3_8b_pretrain_config"]["global_batch_size"] == 512
    assert data["recipes"]["llama3_8b_pretrain_config"]["seq_length"] == 8192
    assert data["recipes"]["nemotron_3_nano_pretrain_config"]["global_batch_size"] == 1024
    nano = data["perf_recipes"]["nemotron_3_nano_pretrain_8gpu_gb200_fp8mx_config"]
    assert (nano["global_batch_size"], nano["seq_length"]) == (512, 8192)
    qwen = data["perf_recipes"]["qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config"]
    assert (qwen["global_batch_size"], qwen["seq_length"]) == (512, 4096)
    # a recipe that raises (Qwen3-Next has no PEFT) is not known
    assert data["recipes"]["qwen3_next_80b_a3b_peft_config"]["global_batch_size"] is None


def test_the_lookup_follows_bridges_launcher() -> None:
    got = recipe_defaults(
        "qwen3_30b_a3b", "pretrain", gpu="GB200", compute_dtype="fp8_mx", num_gpus=8
    )
    assert got is not None and got.kind == "perf"
    assert got.name == "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config"
    lib = recipe_defaults("qwen3_30b_a3b", "pretrain", use_recipes=True)
    assert lib is not None and lib.kind == "library"
    assert lib.function == "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
    # the legacy variant labels v1/v2 are the canonical recipe
    v1 = recipe_defaults(
        "qwen3_30b_a3b", "pretrain", gpu="gb200", compute_dtype="fp8_mx", num_gpus=8,
        config_variant="v1",
    )  # fmt: skip
    assert v1 == got
    other = recipe_defaults(
        "qwen3_30b_a3b", "pretrain", gpu="gb200", compute_dtype="fp8_mx", num_gpus=128
    )
    assert other is not None and other.kind == "library" and "128 GPUs" in other.why
    none = recipe_defaults("qwen3_30b_a3b", "pretrain", gpu="h100", compute_dtype="nvfp4")
    assert none is not None and none.why == "no performance recipe for h100 nvfp4"
    assert recipe_defaults("mixtral_8x7b", "pretrain", gpu="h100", compute_dtype="bf16") is None


#: The Megatron-Bridge commit the table is extracted from (the r0.6.0 head; the commit
#: tests/fixtures/upstream/bridge_config.json pins too).
TABLE_COMMIT = "6124fbe38a68eea9c4f4be3aa5e084bd5d461d98"


def _bridge_source() -> list[str] | None:
    """Megatron-Bridge's source from $DSE_MEGATRON_BRIDGE_GIT (a git directory of the
    upstream clone, read at :data:`TABLE_COMMIT`), or a folder holding src/megatron/bridge of
    that commit."""
    path = os.environ.get("DSE_MEGATRON_BRIDGE_GIT")
    if not path or not Path(path).exists():
        return None
    p = Path(path)
    if (p / "src" / "megatron" / "bridge").is_dir():
        return ["--tree", str(p)]
    return ["--repo", str(p), "--commit", TABLE_COMMIT]


def test_the_table_is_what_the_script_extracts(tmp_path: Path) -> None:
    """Re-extracts the table from Megatron-Bridge at :data:`TABLE_COMMIT` (skipped where no
    clone is named: it is not part of this repository)."""
    args = _bridge_source()
    if args is None:
        pytest.skip("$DSE_MEGATRON_BRIDGE_GIT (a git directory of the upstream clone) is not set")
    out = tmp_path / "defaults.yaml"
    script = REPO / "scripts" / "extract_bridge_recipe_defaults.py"
    subprocess.run([sys.executable, str(script), *args, "-o", str(out)], check=True)
    got, stored = yaml.safe_load(out.read_text()), yaml.safe_load(DATA.read_text())
    for section in ("recipes", "perf_recipes"):
        assert got[section] == stored[section], section
