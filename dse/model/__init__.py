"""What can be known of a configuration before a GPU runs it: the validity rules, the space
check, the FLOPs count and the cost model (estimates, never training results)."""
