"""The ``dse`` command (:mod:`dse.cli.main`) and its sub-commands' modules."""
