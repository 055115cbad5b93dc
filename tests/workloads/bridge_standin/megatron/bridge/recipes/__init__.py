"""Recipe functions exported as Bridge exports them (a name lookup is all dse does here)."""


def llama32_1b_pretrain_config():  # noqa: ANN201
    raise NotImplementedError("stand-in: only the name is looked up")


def nemotron_omni_cord_v2_sft_4gpu_h100_bf16_config():  # noqa: ANN201
    raise NotImplementedError("stand-in: only the name is looked up")


def omni_like_config():  # noqa: ANN201
    """Mixed precision with fp32 reduction off, as the Omni 8-GPU recipe sets it."""
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.mixed_precision import MixedPrecisionConfig

    return ConfigContainer(
        mixed_precision=MixedPrecisionConfig(bf16=True, grad_reduce_in_fp32=False)
    )
