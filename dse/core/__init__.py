"""The vocabulary every layer speaks.

Owns: ``records`` (trial states and records, the trial contract, ``MetricsWriter``, the
closed name vocabularies), ``exceptions`` (every error dse raises), ``bounds`` (the input
bounds), ``registry`` (the plugin ``Registry``; the table is :mod:`dse.plugins`), ``expr``
(space-file constraint expressions), ``safeyaml``, ``names`` (study names), ``envpolicy``
(which environment variables a trial may get), ``figures`` (how a figure is printed). The
statistics of measured figures are :mod:`dse.stats`. Imports nothing else of dse."""
