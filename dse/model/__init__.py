"""What can be known of a configuration before a GPU runs it (estimates, never results).

Owns: ``rules`` (the validity rules, each the Megatron check it mirrors), ``space_check``
(``dse validate``'s count of valid configurations), ``flops`` (Megatron's model-FLOPs
convention: dense, MoE, hybrid), ``costmodel/`` (memory and speed estimates, calibrated on
measured trials)."""
