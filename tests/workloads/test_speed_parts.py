"""workloads/megatron/_speed.py on its own (CPU torch): torch's AdamW found inside Megatron-style
wrappers, switched between its fused and foreach paths with the state moved along and the
same update, and the live-tensor census a warm worker reports."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.conftest import needs_megatron

pytestmark = needs_megatron


def _adamw(fused: bool | None = None) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    opt = torch.optim.AdamW([w], lr=1e-2, foreach=fused is False or None, fused=fused)
    return w, opt


def _step(w: Any, opt: Any, n: int = 3) -> None:
    for i in range(n):
        opt.zero_grad()
        ((w * (i + 1)) ** 2).sum().backward()
        opt.step()


def test_torch_adams_looks_through_wrappers_once() -> None:
    from dse.workloads.megatron._speed import adam_impl_of, torch_adams

    _, a = _adamw(False)
    _, b = _adamw(False)
    mixed = SimpleNamespace(optimizer=a)  # a mixed-precision wrapper holds .optimizer
    chained = SimpleNamespace(chained_optimizers=[mixed, SimpleNamespace(optimizer=b), mixed])
    found = list(torch_adams(chained))
    assert len(found) == 2 and {id(o) for o in found} == {id(a), id(b)}
    assert adam_impl_of(chained) == "foreach"
    assert list(torch_adams(SimpleNamespace(optimizer=None))) == []
    assert adam_impl_of(SimpleNamespace()) is None  # TE's or Apex's FusedAdam: not torch's


def test_switching_moves_the_state_and_keeps_the_update() -> None:
    import torch

    from dse.workloads.megatron._speed import adam_impl_of, set_adam_impl

    w1, o1 = _adamw(False)  # foreach all along
    w2, o2 = _adamw(False)  # foreach, then fused, then foreach again
    _step(w1, o1)
    _step(w2, o2)
    assert set_adam_impl(SimpleNamespace(optimizer=o2), "fused") == 1
    assert adam_impl_of(o2) == "fused"
    step = o2.state[w2]["step"]
    assert step.device == w2.device and step.dtype == torch.float32  # fused keeps it on device
    _step(w1, o1)
    _step(w2, o2)
    torch.testing.assert_close(w2, w1, rtol=1e-5, atol=1e-6)  # the same update (last bits aside)
    assert set_adam_impl(o2, "foreach") == 1 and adam_impl_of(o2) == "foreach"
    assert o2.state[w2]["step"].device.type == "cpu"
    _step(w1, o1)
    _step(w2, o2)
    torch.testing.assert_close(w2, w1, rtol=1e-5, atol=1e-6)


def test_a_parameter_the_fused_kernel_cannot_take_leaves_the_optimizer_alone() -> None:
    import torch

    from dse.workloads.megatron._speed import adam_impl_of, set_adam_impl

    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))
    opt = torch.optim.AdamW([p], foreach=True)
    assert not p.is_floating_point()
    assert set_adam_impl(opt, "fused") == 0 and adam_impl_of(opt) == "foreach"


def test_live_tensors_counts_what_is_kept() -> None:
    import torch

    from dse.workloads.megatron._speed import live_tensors

    before = live_tensors()
    kept = [torch.ones(256, 1024) for _ in range(4)]  # 4 MiB
    view = kept[0][:10]  # a view shares its storage: counted once in MiB
    after = live_tensors()
    assert after["cpu_n"] - before["cpu_n"] >= 5
    assert 3.9 <= after["cpu_mib"] - before["cpu_mib"] <= 4.5
    del kept, view


def test_cudagraphable_rng_follows_local_cuda_graphs() -> None:
    from dse.workloads.megatron._speed import cudagraphable_rng

    assert cudagraphable_rng({"cuda_graph_impl": "local"})
    assert not cudagraphable_rng({"cuda_graph_impl": "transformer_engine"})
    assert not cudagraphable_rng({})
