"""pretrain: runtime_config_update (imported by name, as Bridge's pretrain.py does), then
Megatron's iteration lines for train.train_iters iterations."""

from __future__ import annotations

from megatron.bridge.training.config import runtime_config_update


def pretrain(config, forward_step_func=None) -> None:  # noqa: ANN001
    runtime_config_update(config)
    n = config.train.train_iters
    for it in range(1, n + 1):
        print(
            f" [2026-01-01 00:00:0{it % 10}] iteration {it:8d}/{n:8d} | consumed samples: "
            f"{it * config.train.global_batch_size:12d} | elapsed time per iteration (ms): "
            f"{250.0 if it == 1 else 100.0:.1f} | learning rate: 1.000000E-04 | global batch "
            f"size: {config.train.global_batch_size:5d} | lm loss: {7.0 - 0.1 * it:.6E} | "
            "loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 |",
            flush=True,
        )
    print(
        "[Rank 0] (after 4 iterations) memory (MB) | allocated: 100.0 | max allocated: "
        "200.0 | reserved: 300.0 | max reserved: 300.0",
        flush=True,
    )
