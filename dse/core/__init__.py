"""The vocabulary every layer speaks, and the small engines every layer shares.

Owns: ``records`` (trial states and records, the trial contract, ``MetricsWriter``, the
closed name vocabularies), ``exceptions`` (every error dse raises), ``bounds`` (the input
bounds), ``registry`` (the plugin ``Registry``; the table is :mod:`dse.plugins`), ``expr``
(space-file constraint expressions), ``safeyaml``, ``names`` (study names), ``envpolicy``
(which environment variables a trial may get), ``figures`` (how a figure is printed);
and three engines: ``measure`` (warm-up, steady state and its interval, the stopping rule),
``numerics`` (the loss-parity judgement), ``table`` (the replay table reader). Imports
nothing else of dse."""
