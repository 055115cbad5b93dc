"""Other tools' files, both ways: the one place dse exports (writes another tool's format).

Owns: ``cloudai/`` (NVIDIA CloudAI's test scenarios in, a best configuration out as a CloudAI
test: ``cloudai.export``) and ``optuna_export`` (a study written into an Optuna storage)."""
