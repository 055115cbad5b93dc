"""The trainer's speed parts (dse/workloads/megatron/_speed.py): torch's AdamW switched between
its foreach and fused implementations mid-run gives the same parameters as either alone;
the rotary-embedding cache of a finished trial is cleared; live tensors are counted.
torch and Megatron-Core (the megatron extra) are real parts: without them these tests skip
naming them, and fail under ``CI`` (tests/conftest.py ``require_megatron``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dse.workloads.megatron import _speed
from tests.conftest import needs_megatron

if TYPE_CHECKING:
    import torch

pytestmark = needs_megatron


def _run(impls: list[str]) -> list[torch.Tensor]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    class Wrapped:  # a Megatron optimizer holds the torch one as .optimizer
        optimizer = opt

    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for impl in impls:
        assert _speed.set_adam_impl(Wrapped(), impl) == 1  # type: ignore[arg-type]
        assert _speed.adam_impl_of(Wrapped()) == impl
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_fused_and_foreach_adamw_agree_and_switch_mid_run() -> None:
    import torch

    fused = _run(["fused"] * 4)
    foreach = _run(["foreach"] * 4)
    mixed = _run(["foreach", "fused", "foreach", "fused"])
    for a, b, c in zip(fused, foreach, mixed, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
        assert torch.allclose(a, c, rtol=1e-5, atol=1e-7)


def test_no_torch_adam_is_left_alone() -> None:
    import torch

    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert _speed.set_adam_impl(sgd, "fused") == 0 and _speed.adam_impl_of(sgd) is None


def test_rotary_cache_cleared_and_live_tensors_counted() -> None:
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    rope = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, use_cpu_initialization=True)
    rope.get_emb = lambda n, offset=0: torch.zeros(n, 1, 1, 16)  # no CUDA device here
    rope(64)
    assert RotaryEmbedding.forward.cache_info().currsize >= 1
    assert "RotaryEmbedding.forward" in _speed.clear_trial_caches()
    assert RotaryEmbedding.forward.cache_info().currsize == 0
    keep = torch.ones(1024)  # noqa: F841 - counted while alive
    got = _speed.live_tensors()
    assert got["cpu_n"] >= 1 and got["cpu_mib"] >= 1024 * 4 / 2**20
