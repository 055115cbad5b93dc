"""Extract the override paths a NeMo 2.0 LLM recipe accepts at a pinned commit.

``nemo llm pretrain --factory NAME KEY=VALUE`` sets attributes of the recipe's
``run.Partial``: ``trainer.strategy.X`` (``nl.MegatronStrategy``'s constructor arguments),
``trainer.strategy.ddp.X`` (Megatron-Core ``DistributedDataParallelConfig``),
``model.config.X`` (``llm.GPTConfig``, a Megatron-Core ``TransformerConfig``),
``optim.config.X`` (Megatron-Core ``OptimizerConfig``), ``log.X`` (``nl.NeMoLogger``) and
``data.X`` (the GPT data modules' constructor arguments). This reads those by AST from a
NeMo git clone and, for the Megatron-Core classes, from a Megatron-LM clone; ``trainer.X``
(``nl.Trainer``, Lightning's ``Trainer``) from a Lightning clone at the newest release NeMo
allows (``requirements_lightning.txt``: ``lightning<=2.4.0``). Writes a JSON data file.

    python scripts/extract_upstream_nemo.py --repo PATH/TO/NeMo/.git --commit v2.4.0 \\
        --megatron-repo PATH/TO/Megatron-LM/.git \\
        --megatron-commit 55ac7082517c3878ae653c07c09c534b8aed49f6 \\
        --lightning-repo PATH/TO/pytorch-lightning/.git --lightning-commit 2.4.0 \\
        -o tests/fixtures/upstream/nemo_recipe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract_upstream_common import GitTree, Source  # noqa: E402

#: NeMo v2.4.0, the last release line whose LLM collection (NeMo 2.0 recipes) is complete.
DEFAULT_COMMIT = "2381f42f6979449b5b99538f8f80135831009b51"
#: Megatron-Core core_v0.16.1 for the Megatron-Core config classes (NeMo names no commit).
DEFAULT_MEGATRON_COMMIT = "55ac7082517c3878ae653c07c09c534b8aed49f6"

STRATEGY = ("nemo.lightning.pytorch.strategies.megatron_strategy", "MegatronStrategy")
DDP = ("megatron.core.distributed", "DistributedDataParallelConfig")
#: Lightning 2.4.0, the newest NeMo v2.4.0 allows.
DEFAULT_LIGHTNING_COMMIT = "2129fdf3622e39ba46be4e1139af408e7e951cf3"
#: override prefix -> (module, class, "fields" of a dataclass | "init" constructor arguments)
TARGETS: dict[str, list[tuple[str, str, str]]] = {
    "trainer": [("lightning.pytorch.trainer.trainer", "Trainer", "init")],
    "trainer.strategy": [(*STRATEGY, "init")],
    "trainer.strategy.ddp": [(*DDP, "fields")],
    "model.config": [("nemo.collections.llm.gpt.model.base", "GPTConfig", "fields")],
    "optim.config": [("megatron.core.optimizer", "OptimizerConfig", "fields")],
    "log": [("nemo.lightning.nemo_logger", "NeMoLogger", "fields")],
    "data": [
        ("nemo.collections.llm.gpt.data.mock", "MockDataModule", "init"),
        ("nemo.collections.llm.gpt.data.pre_training", "PreTrainingDataModule", "init"),
        ("nemo.collections.llm.gpt.data.fine_tuning", "FineTuningDataModule", "init"),
    ],
    # packed SFT: the recipe's data.packed_sequence_specs (llm.gpt.data.PackedSequenceSpecs)
    "data.packed_sequence_specs": [
        ("nemo.collections.llm.gpt.data.packed_sequence", "PackedSequenceSpecs", "fields"),
    ],
}  # fmt: skip


def extract(nemo: GitTree, megatron: GitTree, lightning: GitTree) -> dict[str, Any]:
    src = Source(
        [("nemo", nemo, ""), ("megatron", megatron, ""), ("lightning", lightning, "src/")]
    )
    prefixes: dict[str, dict[str, list[str]]] = {}
    for prefix, classes in TARGETS.items():
        out: dict[str, list[str]] = {}
        for module, cls, how in classes:
            hit = src.resolve(module, cls)
            if hit is None:
                raise SystemExit(f"{module}:{cls} not found")
            names = (
                src.init_params(module, cls) if how == "init" else list(src.fields(module, cls))
            )
            out[f"{hit[0]}:{cls}"] = sorted(names)
        prefixes[prefix] = out
    return {
        "source": "NVIDIA/NeMo",
        "commit": nemo.commit,
        "commit_date": nemo.date(),
        "megatron_lm_commit": megatron.commit,
        "lightning_commit": lightning.commit,
        "extracted_by": "scripts/extract_upstream_nemo.py (AST of MegatronStrategy, GPTConfig, "
        "NeMoLogger, the GPT data modules, the Megatron-Core config dataclasses and "
        "Lightning's Trainer)",
        "prefixes": prefixes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a NeMo git directory")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("--megatron-repo", required=True, help="a Megatron-LM git directory")
    ap.add_argument("--megatron-commit", default=DEFAULT_MEGATRON_COMMIT)
    ap.add_argument("--lightning-repo", required=True, help="a pytorch-lightning git directory")
    ap.add_argument("--lightning-commit", default=DEFAULT_LIGHTNING_COMMIT)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    data = extract(
        GitTree(args.repo, args.commit),
        GitTree(args.megatron_repo, args.megatron_commit),
        GitTree(args.lightning_repo, args.lightning_commit),
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    n = sum(len(v) for p in data["prefixes"].values() for v in p.values())
    sys.stderr.write(f"{len(data['prefixes'])} override prefixes, {n} names at {data['commit']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
