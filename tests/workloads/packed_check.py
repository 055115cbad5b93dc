"""Packed rows against their sequences trained one by one (run as a module, one process).

    python -m tests.workloads.packed_check --out result.json SPEC.json [SPEC.json ...]

For each packed trial spec (one rank, CPU) it builds the trial's model as the built-in
trainer does (:func:`dse.workloads.megatron.trainer.build`) and takes row 0 of step 0's
global batch, as the trainer makes it (:class:`GlobalBatches`, :func:`packed_masks`):

* ``packed``: the row at once, through the trainer's block-diagonal mask and per-sequence
  position ids, its loss masked where the input ends a sequence;
* ``separate``: each of the row's sequences alone (its own causal attention, positions from
  0, no mask), the same tokens and loss mask;
* ``unmasked``: the row as one sequence (what training it unpacked would compute).

It writes the largest per-token loss difference packed - separate and packed - unmasked,
the largest gradient difference packed - separate (the DDP main grads of one backward of
the summed loss, relative to the largest gradient), and the whole step-0 batch's masked
mean loss at the initial weights (what the trial's first step reports) beside its loss
trained unpacked (no mask, positions 0..s-1, every token counted).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _grads(chunk: Any, loss: Any) -> Any:
    import torch

    chunk.zero_grad_buffer()
    loss.backward()
    return torch.cat([p.main_grad.reshape(-1).clone() for p in chunk.parameters()
                      if p.requires_grad])  # fmt: skip


def check(spec_path: str) -> dict[str, Any]:
    import torch

    from dse.core.records import TrialSpec
    from dse.workloads.megatron._data import GlobalBatches, eod_id, packed_masks
    from dse.workloads.megatron._plan import make_plan
    from dse.workloads.megatron.trainer import build, release_trial_state

    spec = TrialSpec.model_validate_json(Path(spec_path).read_text())
    plan = make_plan(spec, [])
    built = build(plan, torch.device("cpu"))
    chunk = built.chunks[0]
    chunk.train()
    sem, vocab = plan.semantics, plan.model.vocab_size
    data = GlobalBatches(sem.data, global_batch_size=sem.global_batch_size,
                         seq_length=sem.seq_length, vocab_size=vocab, packed=True)  # fmt: skip
    batch = data.global_batch(0)
    eod = eod_id(vocab)

    # the whole step-0 batch at the initial weights: the masked mean the trial reports
    with torch.no_grad():
        tokens, labels = batch[:, :-1], batch[:, 1:]
        att, lmask, pos = packed_masks(tokens, eod)
        losses = chunk(tokens, pos, att, labels=labels).float()
        batch_loss = float((losses * lmask).sum() / lmask.sum())
        plain = chunk(tokens, torch.arange(tokens.shape[1]).expand_as(tokens), None,
                      labels=labels).float()  # fmt: skip
        batch_loss_unpacked = float(plain.mean())

    tokens, labels = batch[:1, :-1], batch[:1, 1:]
    att, lmask, pos = packed_masks(tokens, eod)
    packed = chunk(tokens, pos, att, labels=labels).float()
    g_packed = _grads(chunk, (packed * lmask).sum())

    s = tokens.shape[1]
    ends = [i + 1 for i in range(s) if int(tokens[0, i]) == eod]
    bounds = [0, *ends] + ([s] if not ends or ends[-1] != s else [])
    parts, total = [], None
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        n = b - a
        out = chunk(tokens[:, a:b], torch.arange(n).unsqueeze(0), None, labels=labels[:, a:b])
        out = out.float()
        parts.append(out.detach())
        term = (out * lmask[:, a:b]).sum()
        total = term if total is None else total + term
    assert total is not None
    g_separate = _grads(chunk, total)
    separate = torch.cat(parts, dim=1)

    with torch.no_grad():
        unmasked = chunk(tokens, torch.arange(s).unsqueeze(0), None, labels=labels).float()
    result = {
        "sequences": len(bounds) - 1,
        "loss_diff_separate": float((packed.detach() - separate).abs().max()),
        "loss_diff_unmasked": float((packed.detach() - unmasked).abs().max()),
        "grad_rel_diff_separate": float(
            (g_packed - g_separate).abs().max() / g_separate.abs().max()
        ),
        "batch_loss_step0": batch_loss,
        "batch_loss_step0_unpacked": batch_loss_unpacked,
    }
    del chunk, built
    release_trial_state("cpu")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("specs", nargs="+")
    args = parser.parse_args(argv)
    from dse.workloads.megatron import _compat, _cpu_shims
    from dse.workloads.megatron.trainer import _Dist

    _cpu_shims.install()
    _Dist().init("cpu")
    _compat.apply()
    out = {Path(p).stem: check(p) for p in args.specs}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
