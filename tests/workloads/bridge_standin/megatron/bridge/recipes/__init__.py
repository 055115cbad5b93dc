"""Recipe functions exported as Bridge exports them (a name lookup is all dse does here)."""


def llama32_1b_pretrain_config():  # noqa: ANN201
    raise NotImplementedError("stand-in: only the name is looked up")


def nemotron_omni_cord_v2_sft_4gpu_h100_bf16_config():  # noqa: ANN201
    raise NotImplementedError("stand-in: only the name is looked up")
