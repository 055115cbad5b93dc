"""Run several trial specs one after the other in one torchrun job (one start-up for all).

``python -m torch.distributed.run --nproc-per-node W tests/workloads/parity_trials.py
a.json b.json ...``: each spec runs through the built-in trainer's own ``run_trial`` (the
same build, data, initialisation and training as a trial process) and writes its metrics
file; parallel state is torn down between specs. Used by the loss-parity tests, where a
fresh process per configuration would cost ~10 s of imports each.
"""

from __future__ import annotations

import sys

from dse.core.records import MetricsWriter, TrialSpec
from dse.workloads.megatron import trainer
from dse.workloads.megatron._plan import TrialFailure


def main(paths: list[str]) -> int:
    trainer._quiet_known_warnings()
    dist = trainer._Dist()
    for path in paths:
        with open(path) as f:
            spec = TrialSpec.model_validate_json(f.read())
        writer = MetricsWriter(spec.metrics_path)
        try:
            summary = trainer.run_trial(spec, dist, writer)
        except TrialFailure as e:
            writer.failure(e.failure_class, e.reason, e.metrics)
        else:
            if dist.rank == 0:
                writer.summary(summary)
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    import torch.distributed as tdist

    tdist.barrier()
    tdist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
