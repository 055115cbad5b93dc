"""NeMo 2.0's own trainer on the CPU: ``python -m dse.workloads.megatron.nemo_cpu --factory NAME
-y KEY=VALUE ...``, the NeMo launcher's command with ``workload.launcher.module`` naming this
module, run in an interpreter that has NeMo 2.0 (the ``nemo`` extra; docs/interop.md).

What runs is NeMo's: the recipe comes from NeMo's own factory (``llm.<NAME>.pretrain_recipe``,
the one ``nemo llm pretrain --factory NAME`` calls), the ``KEY=VALUE`` overrides are applied by
NeMo-Run's own command-line parser (``nemo_run.cli.cli_parser.parse_cli_args``), and the built
``run.Partial`` is called in this process (``llm.pretrain``: NeMo's ``Trainer`` with its
``MegatronStrategy``, as NeMo-Run's direct run does). The space sets the CPU itself, as
overrides the resolved-configuration check reads back: ``trainer.accelerator=cpu`` (on which
Lightning's DDP strategy, MegatronStrategy's base, takes gloo) and a model small enough.

Where the trainer is on the CPU, what nemo-toolkit 2.7.3 with megatron-core 0.15 cannot do
there is worked around from this process (no file of NeMo or Megatron-Core is edited), and
each is said in the log:

* CUDA calls on NeMo's training path (``nemo/lightning/megatron_parallel.py``:
  ``init_model_parallel`` initialises DDP inside ``torch.cuda.stream(torch.cuda.Stream())``,
  line 617, unconditionally: "RuntimeError: torch.cuda.Stream requires CUDA support"; the batch
  is moved with ``Tensor.cuda`` in ``gpt/model/base.py`` ``gpt_data_step``): dse's Megatron-Core
  CPU shims (:mod:`._cpu_shims`) and the CUDA generator's state calls as no-ops.
* Megatron's RNG tracker: ``nemo/lightning/megatron_init.py`` ``_set_random_seed`` seeds it
  only where ``torch.cuda.device_count() > 0``; unseeded, building the model raises "cuda rng
  state model-parallel-rng is not added". It is seeded before the model is built (Lightning's
  ``setup`` hook, after NeMo's strategy initialised model parallelism) with NeMo's own seed
  (1234 plus 100 per pipeline rank, as ``_set_random_seed`` does).
* The mock data: ``MockDataModule`` without a tokenizer downloads GPT-2's vocabulary (a
  :class:`NullTokenizer` of the model's ``vocab_size`` is given instead), and its ``setup``
  passes ``create_attention_mask`` positionally into ``_MockGPTDataset``'s ``seed``
  (``gpt/data/mock.py``), so no batch has a mask; without Transformer Engine (none on a CPU)
  ``gpt_forward_step`` then asserts one. The datasets are built with the mask.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from dse.workloads.megatron import _cpu_shims

__all__ = ["main"]

#: NeMo's default seed of Megatron's RNG (``nemo/lightning/megatron_init.py``).
NEMO_SEED = 1234


def _say(text: str) -> None:
    sys.stdout.write(f"dse nemo_cpu: {text}\n")
    sys.stdout.flush()


def _install_cpu_shims() -> None:
    import torch

    _cpu_shims.install()
    torch.cuda.get_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda *a, **k: None
    torch.cuda.manual_seed = lambda *a, **k: None
    _say(
        "CPU: dse's Megatron-Core CPU shims installed (CUDA streams, devices and generator "
        "state mapped to the CPU)"
    )


def _cpu_classes() -> tuple[type, type]:
    """The seeding callback and the mock data module with its attention mask (NeMo imported)."""
    import lightning.pytorch as pl
    from nemo.collections.llm.gpt.data.mock import MockDataModule, _MockGPTDataset

    class SeedOnCpu(pl.Callback):  # type: ignore[misc]
        """Seeds Megatron's RNG tracker, which NeMo seeds only where CUDA has devices."""

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            # after NeMo's strategy initialised model parallelism, before the model is built
            from megatron.core import parallel_state

            rank = parallel_state.get_pipeline_model_parallel_rank()
            _cpu_shims.seed_model_parallel(NEMO_SEED + 100 * rank)

    class MockDataWithMask(MockDataModule):  # type: ignore[misc]
        """NeMo's mock data, its datasets built with the attention mask it asked for."""

        def setup(self, stage: str = "") -> None:
            super().setup(stage)
            for name in ("_train_ds", "_validation_ds", "_test_ds"):
                ds = getattr(self, name)
                setattr(self, name, _MockGPTDataset(
                    self.tokenizer, ds.name, ds.length, self.seq_length,
                    create_attention_mask=True,
                ))  # fmt: skip

    return SeedOnCpu, MockDataWithMask


def _adapt_to_cpu(recipe: Any) -> None:
    import fiddle as fdl
    import nemo_run as run
    from nemo.collections.common.tokenizers.null_tokenizer import NullTokenizer
    from nemo.collections.llm.gpt.data.mock import MockDataModule

    seed_cb, mock_with_mask = _cpu_classes()
    callbacks = list(recipe.trainer.callbacks or [])
    recipe.trainer.callbacks = [*callbacks, run.Config(seed_cb)]
    _say(f"CPU: Megatron's RNG tracker seeded before the model is built ({NEMO_SEED})")
    if fdl.get_callable(recipe.data) is MockDataModule:
        if getattr(recipe.data, "tokenizer", None) is None:
            vocab = recipe.model.config.vocab_size
            if vocab is None:
                raise SystemExit(
                    "dse nemo_cpu: model.config.vocab_size: the mock data on the CPU needs the "
                    "model's vocabulary size (NeMo's default tokenizer is downloaded); set it "
                    "as an override"
                )
            recipe.data.tokenizer = run.Config(NullTokenizer, vocab_size=int(vocab) - 1)
            _say(f"CPU: the mock data's tokenizer is NullTokenizer({int(vocab) - 1})")
        fdl.update_callable(recipe.data, mock_with_mask)
        _say("CPU: the mock datasets are built with their attention mask")


def build(factory: str, overrides: Sequence[str]) -> Any:
    """NeMo's recipe ``factory`` with ``overrides`` applied by NeMo-Run's parser."""
    from nemo.collections import llm
    from nemo_run.cli.cli_parser import parse_cli_args

    recipe = getattr(llm, factory).pretrain_recipe()
    return parse_cli_args(recipe, list(overrides))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--factory", required=True, help="NeMo recipe module (llm.<NAME>)")
    p.add_argument("-y", dest="yes", action="store_true", help="run without asking (as nemo)")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides of the recipe")
    args = p.parse_args(argv)
    # before NeMo is imported: the shims replace torch.cuda functions NeMo binds at import
    cpu = any(
        key.strip() == "trainer.accelerator" and value.strip().strip("'\"") == "cpu"
        for key, _, value in (o.partition("=") for o in args.overrides)
    )
    if cpu:
        _install_cpu_shims()
    import fiddle as fdl

    recipe = build(args.factory, args.overrides)
    if cpu:
        _adapt_to_cpu(recipe)
    _say(f"running NeMo's llm.{args.factory}.pretrain_recipe with {len(args.overrides)} overrides")
    fdl.build(recipe)()
    return 0


if __name__ == "__main__":
    sys.exit(main())
