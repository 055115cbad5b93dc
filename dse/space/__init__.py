"""The space file: knobs and their facts, the parallel layout, derived settings, the recipe
spec, the model catalog and the search space itself. Imports only :mod:`dse.core`."""
