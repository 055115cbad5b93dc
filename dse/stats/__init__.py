"""What measured figures say, for every layer above the vocabulary: the statistics of a
trial's step times and the figures kept from them.

Owns: ``measure`` (warm-up, the steady state and its interval, the stopping rule, dominance),
``numerics`` (the loss-parity judgement), ``table`` (the measured tables the replay reads),
``gpu_figures`` (a trial's part of its study's GPU time, as the storage keeps it). Pure Python;
imports only :mod:`dse.core`."""
