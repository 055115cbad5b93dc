"""What a study's stored trials say: the objective, measurement noise and ties, run settings,
the GPU-time account and the export of a best configuration."""
