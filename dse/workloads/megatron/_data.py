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

Packed sequences (``semantics.packed_sequences``): a row holds several sequences, each
ending at the end-of-document token (id ``vocab_size - 1``, the ``NullTokenizer``'s). With
synthetic data a row's sequence lengths are drawn uniformly from
:data:`PACKED_SYNTHETIC_LENGTHS` (fractions of ``seq_length``), from the step's generator,
and no other token is the end-of-document id; mock data keeps Megatron's own documents
(their lengths, up to 4096 tokens, rarely end inside a short row). Each micro-batch then
carries Megatron's ``attention_mask`` (block-diagonal causal), ``loss_mask`` (0 where the
input is the end-of-document token) and ``position_ids`` (restarting at each sequence),
made by megatron-core's own ``_get_ltor_masks_and_position_ids`` with
``reset_position_ids``, ``reset_attention_mask`` and ``eod_mask_loss`` on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dse.space.searchspace import DataSpec

__all__ = [
    "GlobalBatches",
    "PACKED_SYNTHETIC_LENGTHS",
    "eod_id",
    "load_token_file",
    "mock_dataset",
    "packed_masks",
    "packed_rows_stats",
]

#: The shortest and longest sequence of a synthetic packed row, as fractions of
#: ``seq_length`` (each sequence at least 2 tokens).
PACKED_SYNTHETIC_LENGTHS = (1 / 8, 1 / 2)


def eod_id(vocab_size: int) -> int:
    """The end-of-document token id of the trainer's data: the last of the vocabulary, as
    Megatron-Core's ``NullTokenizer(vocab_size - 1)`` has it."""
    return vocab_size - 1


def packed_masks(
    tokens: torch.Tensor, eod: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(attention_mask [b, 1, s, s] bool, True where masked; loss_mask [b, s] float;
    position_ids [b, s])`` of packed rows of input ``tokens [b, s]``: each sequence ends at
    an ``eod`` token and attends causally within itself only (Megatron-Core's
    ``_get_ltor_masks_and_position_ids`` with ``reset_position_ids``,
    ``reset_attention_mask`` and ``eod_mask_loss``, one row at a time)."""
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    masks, losses, positions = [], [], []
    for row in tokens:
        att, loss, pos = _get_ltor_masks_and_position_ids(
            row, eod, reset_position_ids=True, reset_attention_mask=True,
            eod_mask_loss=True, create_attention_mask=True,
        )  # fmt: skip
        masks.append(att)
        losses.append(loss)
        positions.append(pos)
    return torch.stack(masks), torch.stack(losses), torch.stack(positions)


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
    """Global batches of ``[global_batch_size, seq_length + 1]`` token ids (``packed``:
    several sequences per row, see the module docstring)."""

    def __init__(
        self,
        data: DataSpec,
        *,
        global_batch_size: int,
        seq_length: int,
        vocab_size: int,
        packed: bool = False,
    ) -> None:
        self.data = data
        self.global_batch_size = global_batch_size
        self.seq_length = seq_length
        self.vocab_size = vocab_size
        self.packed = packed
        if packed and data.kind == "path":
            raise ValueError(
                "packed sequences need an end-of-document id, which a token file "
                "(data.kind path) does not name"
            )
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
            if self.packed:
                return self._packed_synthetic(gen, rows, width)
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

    def _packed_synthetic(self, gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
        """Synthetic packed rows: tokens other than the end-of-document id, and an
        end-of-document token closing each sequence of a length drawn from
        :data:`PACKED_SYNTHETIC_LENGTHS` (the row's last sequence runs to its end)."""
        eod = eod_id(self.vocab_size)
        out = torch.randint(0, eod, (rows, width), generator=gen)
        lo = max(2, int(self.seq_length * PACKED_SYNTHETIC_LENGTHS[0]))
        hi = max(lo, int(self.seq_length * PACKED_SYNTHETIC_LENGTHS[1]))
        for j in range(rows):
            end = 0
            while True:
                end += int(torch.randint(lo, hi + 1, (1,), generator=gen))
                if end > self.seq_length:
                    break
                out[j, end - 1] = eod
        return out

    def microbatches(
        self, batch: torch.Tensor, *, dp_rank: int, dp_size: int, micro_batch_size: int
    ) -> list[tuple[torch.Tensor, ...]]:
        """This data-parallel rank's micro-batches of a global batch: ``(tokens, labels)``,
        packed: ``(tokens, labels, attention_mask, loss_mask, position_ids)``
        (:func:`packed_masks`)."""
        mbs = micro_batch_size
        n = self.global_batch_size // (mbs * dp_size)
        out: list[tuple[torch.Tensor, ...]] = []
        for k in range(n):
            lo = (k * dp_size + dp_rank) * mbs
            rows = batch[lo : lo + mbs]
            tokens, labels = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
            if self.packed:
                out.append((tokens, labels, *packed_masks(tokens, eod_id(self.vocab_size))))
            else:
                out.append((tokens, labels))
        return out


def packed_rows_stats(batch: torch.Tensor, vocab_size: int) -> tuple[int, int]:
    """(rows, sequences) of a global batch of packed rows: a row's sequences are its
    end-of-document tokens among its ``seq_length`` inputs, plus the one running to its
    end."""
    tokens = batch[:, :-1]
    ends = (tokens == eod_id(vocab_size)).sum(dim=1)
    open_tail = (tokens[:, -1] != eod_id(vocab_size)).to(ends.dtype)
    return int(tokens.shape[0]), int((ends + open_tail).sum())
