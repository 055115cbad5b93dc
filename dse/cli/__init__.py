"""The ``dse`` command.

Owns: ``main`` (the parser and the study, status, best, verify, export, import and serve
commands), ``bench`` (``dse bench``), ``recipe`` (``dse parse-log``, ``--dry-run``),
``interop`` (``dse cloudai``, ``dse report``). ``python -m dse`` and ``python -m dse.cli``
run it."""
