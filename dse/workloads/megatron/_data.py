"""Training data of a trial: the same global batches for every configuration.

The global batch of step ``i`` depends only on the data spec, ``i``, the global batch size
and the sequence length, never on the parallel layout: every rank builds it (synthetic:
``torch.randint`` from a generator seeded with ``seed + i``; file: a fixed window of the
token stream) and keeps its data-parallel rank's micro-batches. Loss curves of different
layouts are therefore comparable step by step.

``mock``: megatron-core's ``MockGPTDataset`` built as Megatron-LM's ``pretrain_gpt.py``
builds it for ``--mock-data`` (``GPTDatasetConfig`` of its argument defaults: no split, no
position or attention-mask reset, no EOD loss mask; shuffled with the seed; Megatron-Core's
``NullTokenizer`` whose end-of-document id is the last of ``vocab_size``); row ``j`` of step
``i`` is sample ``i * global_batch_size + j``, the order of Megatron-LM's pretraining
sampler, whatever the micro-batching.

Micro-batch ``k`` of data-parallel rank ``r`` holds rows ``[(k*dp + r)*mbs, ... + mbs)`` of the
global batch (the order of Megatron-LM's pretraining sampler).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dse.space.searchspace import DataSpec

__all__ = ["GlobalBatches", "load_token_file", "mock_dataset"]


def load_token_file(path: str | Path) -> Any:
    """The token stream of a file as a 1-D numpy array (memory-mapped).

    ``.npy`` files keep their dtype; any other file is read as raw little-endian int32.
    """
    import numpy as np

    p = Path(path)
    if p.suffix == ".npy":
        arr = np.load(p, mmap_mode="r")
    else:
        arr = np.memmap(p, dtype="<i4", mode="r")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{p}: token ids must be integers, got dtype {arr.dtype}")
    return arr.reshape(-1)


def mock_dataset(seed: int, seq_length: int, vocab_size: int, num_samples: int) -> Any:
    """The training split of megatron-core's ``MockGPTDataset`` as Megatron-LM builds it for
    ``--mock-data --seed seed --seq-length seq_length`` with a ``NullTokenizer`` of
    ``vocab_size`` ids (the last its end-of-document id). ``num_samples``: the samples asked
    for (the dataset spans its whole first epoch, and the order of an epoch does not depend on
    it). Every rank builds it (it is small: 100,000 documents of lengths)."""
    import logging

    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=None,
        blend_per_split=None,
        split=None,
        tokenizer=NullTokenizer(vocab_size - 1),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )
    # "Unable to save MockGPTDataset indexes": nothing is cached on disk for mock data
    quiet = logging.getLogger("megatron.core.datasets")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        train, _valid, _test = BlendedMegatronDatasetBuilder(
            MockGPTDataset, [num_samples, 0, 0], lambda: True, config
        ).build()
    finally:
        quiet.setLevel(level)
    return train


class GlobalBatches:
    """Global batches of ``[global_batch_size, seq_length + 1]`` token ids."""

    def __init__(
        self, data: DataSpec, *, global_batch_size: int, seq_length: int, vocab_size: int
    ) -> None:
        self.data = data
        self.global_batch_size = global_batch_size
        self.seq_length = seq_length
        self.vocab_size = vocab_size
        self._tokens: Any = None
        self._mock: Any = None
        if data.kind == "mock":
            self._mock = mock_dataset(data.seed, seq_length, vocab_size, global_batch_size)
        elif data.kind == "path":
            if data.path is None:  # DataSpec validates this; keep mypy informed
                raise ValueError("data.path is required when data.kind is 'path'")
            self._tokens = load_token_file(data.path)
            need = seq_length + 2
            if self._tokens.shape[0] < need:
                raise ValueError(
                    f"{data.path}: {self._tokens.shape[0]} tokens, fewer than one sequence "
                    f"(seq_length + 1 = {seq_length + 1})"
                )

    def global_batch(self, step: int) -> torch.Tensor:
        """The int64 tokens of step ``step`` (on the CPU)."""
        rows, width = self.global_batch_size, self.seq_length + 1
        if self._mock is not None:
            last = (step + 1) * rows
            if last > len(self._mock):
                raise ValueError(
                    f"data.kind mock: step {step} needs sample {last - 1}, past the first epoch "
                    f"of Megatron's mock dataset ({len(self._mock)} samples of seq_length "
                    f"{self.seq_length}); Megatron-LM reshuffles its later epochs"
                )
            samples = [self._mock[step * rows + j] for j in range(rows)]
            # a sample's labels are its tokens shifted by one: the seq_length + 1 ids back
            return torch.stack(
                [torch.cat([s["tokens"], s["labels"][-1:]]).to(torch.int64) for s in samples]
            )
        if self._tokens is None:
            gen = torch.Generator().manual_seed(self.data.seed + step)
            return torch.randint(0, self.vocab_size, (rows, width), generator=gen)
        import numpy as np

        n = self._tokens.shape[0]
        windows = n - width + 1  # distinct start offsets
        starts = [((step * rows + j) * self.seq_length) % windows for j in range(rows)]
        batch = np.stack([np.asarray(self._tokens[s : s + width], dtype=np.int64) for s in starts])
        out = torch.from_numpy(batch)
        hi = int(out.max())
        if hi >= self.vocab_size or int(out.min()) < 0:
            raise ValueError(
                f"{self.data.path}: token id {hi} is outside the vocabulary "
                f"(vocab_size={self.vocab_size})"
            )
        return out

    def microbatches(
        self, batch: torch.Tensor, *, dp_rank: int, dp_size: int, micro_batch_size: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This data-parallel rank's ``(tokens, labels)`` micro-batches of a global batch."""
        mbs = micro_batch_size
        n = self.global_batch_size // (mbs * dp_size)
        out = []
        for k in range(n):
            lo = (k * dp_size + dp_rank) * mbs
            rows = batch[lo : lo + mbs]
            out.append((rows[:, :-1].contiguous(), rows[:, 1:].contiguous()))
        return out
