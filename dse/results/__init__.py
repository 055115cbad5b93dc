"""What a study's stored trials say (the answers; the HTML report is :mod:`dse.report`).

Owns: ``objective`` (the metric a study ranks by), ``noise`` (intervals, ties, the
noise-aware best and its re-measure plan), ``run_settings`` (the run's overrides and the
effective space), ``trust`` (how far an estimate can be trusted), ``gpu_usage`` (the GPU-time
account of a study), ``best_formats`` (the best configuration in each ``dse best --format``:
JSON, YAML, a recipe's flags or overrides), ``reads`` (the reads of a study database these
modules make, a ``Protocol``: dse.storage sits above and fits it)."""
