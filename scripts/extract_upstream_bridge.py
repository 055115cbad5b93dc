"""Extract the override paths Megatron-Bridge's ``ConfigContainer`` accepts at a pinned commit.

``run_recipe.py KEY=VALUE`` overrides set ``section.field`` on the recipe's
``ConfigContainer`` (``src/megatron/bridge/training/config.py``). This reads, by AST, the
container's sections and, for each, the dataclass fields of every class its annotation
names (``model``: the GPT, T5, hybrid and MIMO model providers, which are Megatron-Core
``TransformerConfig`` subclasses; ``optimizer``, ``ddp``, ``train``, ``checkpoint``, ...),
over their base classes, from the Bridge tree and from the Megatron-LM commit that Bridge
pins as its ``3rdparty/Megatron-LM`` submodule, and the calls of ``runtime_config_update`` in
order (what the tests' stand-in of Bridge must do in the same order). Writes a JSON data file
with both commits.

    python scripts/extract_upstream_bridge.py --repo PATH/TO/Megatron-Bridge/.git \\
        --megatron-repo PATH/TO/Megatron-LM/.git --commit r0.6.0 \\
        -o tests/fixtures/upstream/bridge_config.json
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from extract_upstream_common import GitTree, Source, call_order, submodule_commit  # noqa: E402

CONFIG_MODULE = "megatron.bridge.training.config"
#: The head of the 0.6 release branch (package version 0.6.1 there; later 0.6.x patch
#: releases are cut from it).
DEFAULT_COMMIT = "6124fbe38a68eea9c4f4be3aa5e084bd5d461d98"
_NOT_CLASSES = {"Optional", "Union", "None", "dict", "Dict", "str", "int", "float", "bool",
                "list", "List", "Any", "Literal", "tuple", "Tuple"}  # fmt: skip


def _class_names(annotation: ast.expr) -> list[str]:
    return [
        n.id for n in ast.walk(annotation) if isinstance(n, ast.Name) and n.id not in _NOT_CLASSES
    ]


def extract(bridge: GitTree, megatron: GitTree) -> dict[str, Any]:
    src = Source([("megatron.bridge", bridge, "src/"), ("megatron", megatron, "")])
    hit = src.resolve(CONFIG_MODULE, "ConfigContainer")
    if hit is None:
        raise SystemExit(f"ConfigContainer not found in {CONFIG_MODULE} at {bridge.commit}")
    sections: dict[str, dict[str, list[str]]] = {}
    for f in src.fields(CONFIG_MODULE, "ConfigContainer").values():
        if f.name.startswith("_"):
            continue
        classes: dict[str, list[str]] = {}
        ann = ast.parse(f.annotation, mode="eval").body
        for name in _class_names(ann):
            found = src.resolve(CONFIG_MODULE, name)
            if found is None:
                continue  # a class outside both trees (e.g. a third-party type)
            fields = src.fields(CONFIG_MODULE, name)
            classes[f"{found[0]}:{name}"] = sorted(fields)
        sections[f.name] = classes
    return {
        "source": "NVIDIA-NeMo/Megatron-Bridge",
        "commit": bridge.commit,
        "commit_date": bridge.date(),
        "megatron_lm_commit": megatron.commit,
        "file": "src/megatron/bridge/training/config.py",
        "extracted_by": "scripts/extract_upstream_bridge.py (AST of ConfigContainer and the "
        "dataclasses its sections name, with their bases)",
        "sections": sections,
        # what Bridge does to the recipe's config after the overrides, before the model is
        # built (training/pretrain.py calls it): the calls of runtime_config_update in order
        "runtime_config_update": call_order(
            bridge.read("src/megatron/bridge/training/config.py") or "", "runtime_config_update"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a Megatron-Bridge git directory")
    ap.add_argument("--megatron-repo", required=True, help="a Megatron-LM git directory")
    ap.add_argument("--commit", default=DEFAULT_COMMIT)
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    bridge = GitTree(args.repo, args.commit)
    megatron = GitTree(args.megatron_repo, submodule_commit(bridge, "3rdparty/Megatron-LM"))
    data = extract(bridge, megatron)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    n = sum(len(v) for s in data["sections"].values() for v in s.values())
    sys.stderr.write(f"{len(data['sections'])} sections, {n} fields at {data['commit']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
