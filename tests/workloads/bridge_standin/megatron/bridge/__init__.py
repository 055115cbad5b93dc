"""Stand-in for Megatron-Bridge (see tests/workloads/bridge_standin/README.md)."""
