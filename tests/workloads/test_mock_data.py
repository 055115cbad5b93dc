"""``data.kind: mock``: the built-in trainer's batches are megatron-core's ``MockGPTDataset``
as Megatron-LM's ``pretrain_gpt.py --mock-data`` builds it (the losses of both agree step by
step: tests/workloads/test_upstream_loss_parity.py); row ``j`` of step ``i`` is sample
``i * GBS + j`` whatever the micro-batching, and ``data.seed`` is upstream's ``--seed``."""

from __future__ import annotations

import pytest
import torch

from dse.space.searchspace import DataSpec, Semantics
from tests.conftest import needs_megatron


@needs_megatron
def test_mock_batches_are_megatrons_samples_in_the_samplers_order() -> None:
    from dse.workloads.megatron._data import GlobalBatches, mock_dataset

    data = GlobalBatches(DataSpec(kind="mock", seed=1234), global_batch_size=4, seq_length=64,
                         vocab_size=1024)  # fmt: skip
    ds = mock_dataset(1234, 64, 1024, 4)
    batch = data.global_batch(2)
    assert batch.shape == (4, 65) and batch.dtype == torch.int64
    for j in range(4):
        s = ds[2 * 4 + j]
        assert torch.equal(batch[j, :-1], s["tokens"]) and torch.equal(batch[j, 1:], s["labels"])
    assert int(batch.max()) <= 1023  # NullTokenizer's end-of-document id is the last id
    # the same rows whatever the micro-batching
    one = data.microbatches(batch, dp_rank=0, dp_size=1, micro_batch_size=1)
    two = data.microbatches(batch, dp_rank=0, dp_size=1, micro_batch_size=2)
    assert torch.equal(torch.cat([t for t, _ in one]), torch.cat([t for t, _ in two]))
    # another seed shuffles other samples in
    other = GlobalBatches(DataSpec(kind="mock", seed=7), global_batch_size=4, seq_length=64,
                          vocab_size=1024)  # fmt: skip
    assert not torch.equal(other.global_batch(2), batch)
    with pytest.raises(ValueError, match="past the first epoch of Megatron's mock dataset"):
        data.global_batch(len(ds) // 4 + 1)


def test_mock_data_is_shuffled_with_the_initialisation_seed() -> None:
    with pytest.raises(ValueError, match="data.seed must equal seed"):
        Semantics(global_batch_size=4, seq_length=64, seed=1, data={"kind": "mock", "seed": 2})
    sem = Semantics(global_batch_size=4, seq_length=64, seed=5, data={"kind": "mock", "seed": 5})
    assert sem.init == "layout_invariant"  # the built-in trainer's default initialisation
