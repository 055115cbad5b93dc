"""Other tools' files, both ways: ``cloudai`` (NVIDIA CloudAI's test scenarios in, a best
configuration out as a CloudAI test) and ``optuna_export`` (a study in an Optuna storage)."""
