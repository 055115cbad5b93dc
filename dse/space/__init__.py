"""The space file and what it says.

Owns: ``searchspace`` (``SearchSpace``, ``parse_space``, the runner and agent options),
``knobs`` (every knob's facts: fields, defaults, choices, preferences), ``layout`` (the
parallel layout and its one default policy), ``derive`` (settings derived from knob values),
``recipe_spec`` (a recipe launcher's settings), ``tablemodel`` (a measured table's model
fields), ``catalog/`` (named model architectures). Imports only :mod:`dse.stats` and
:mod:`dse.core`."""
