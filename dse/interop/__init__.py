"""Other tools' files, both ways: NVIDIA CloudAI's test and DSE files, Optuna's storage."""
