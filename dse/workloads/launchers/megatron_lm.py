"""Megatron-LM command lines: ``torchrun pretrain_gpt.py --flag value ...``.

Knob fields become Megatron-LM arguments. The flag names were checked against
``megatron/training/arguments.py`` of Megatron-LM ``core_v0.15.2`` (and the upstream names
fixture, core_v0.16): fusions that Megatron-LM
turns on by default exist only as ``--no-...`` flags; ``grad_reduce_in_fp32`` is
``--accumulate-allreduce-grads-in-fp32`` / ``--grad-reduce-in-bf16``; a VPP size is given as
``--num-layers-per-virtual-pipeline-stage``; the flex dispatcher's DeepEP backend is
``--moe-enable-deepep``, its HybridEP backend ``--moe-flex-dispatcher-backend hybridep``.
The MoE routing a study holds fixed (``semantics.moe_routing``) is rendered with the
semantics (:func:`routing_flags`), also when the recipe's own arguments give the model
(``model_args: false``).

:func:`parse_megatron_args` reads such a command line back into knob values; the built-in
trainer's Megatron-LM entry point (``dse.workloads.megatron.mlm``) uses it, so the same
flags drive both.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from dse.core.exceptions import SpaceError
from dse.space.knobs import KNOBS
from dse.space.layout import PipelineSplit
from dse.space.searchspace import ModelSpec, MoeRouting, SearchSpace
from dse.workloads.launchers._core import Launcher, NotTaken, dse_only, routing_fields

__all__ = [
    "ARG_DEFAULTS",
    "BUILTIN_MODULE",
    "MEGATRON_LM_DDP_DEFAULTS",
    "MEGATRON_LM_MODEL_DEFAULTS",
    "NULL_TOKENIZER_EXTRA",
    "BUILTIN_REFUSES",
    "builtin_refusal",
    "FLAG_OF_FIELD",
    "MegatronLMLauncher",
    "ROUTING_FLAG_OF_FIELD",
    "knob_flags",
    "model_flags",
    "parse_megatron_args",
    "resolved_expectations",
    "routing_flags",
]

#: Field -> Megatron-LM flag for fields given as ``--flag VALUE``.
FLAG_OF_FIELD: dict[str, str] = {
    "tensor_model_parallel_size": "--tensor-model-parallel-size",
    "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "context_parallel_size": "--context-parallel-size",
    "expert_model_parallel_size": "--expert-model-parallel-size",
    "expert_tensor_parallel_size": "--expert-tensor-parallel-size",
    "micro_batch_size": "--micro-batch-size",
    "num_layers_in_first_pipeline_stage": "--num-layers-in-first-pipeline-stage",
    "num_layers_in_last_pipeline_stage": "--num-layers-in-last-pipeline-stage",
    "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout",
    "recompute_granularity": "--recompute-granularity",
    "recompute_method": "--recompute-method",
    "recompute_num_layers": "--recompute-num-layers",
    "recompute_modules": "--recompute-modules",
    "transformer_impl": "--transformer-impl",
    "attention_backend": "--attention-backend",
    "cross_entropy_fusion_impl": "--cross-entropy-fusion-impl",
    "moe_token_dispatcher_type": "--moe-token-dispatcher-type",
    "main_grads_dtype": "--main-grads-dtype",
    "main_params_dtype": "--main-params-dtype",
    "exp_avg_dtype": "--exp-avg-dtype",
    "exp_avg_sq_dtype": "--exp-avg-sq-dtype",
    "data_parallel_sharding_strategy": "--data-parallel-sharding-strategy",
    "cuda_graph_impl": "--cuda-graph-impl",
    "cuda_graph_scope": "--cuda-graph-scope",
}
#: Boolean fields Megatron-LM leaves off by default: ``--flag`` turns them on.
SWITCH_OF_FIELD: dict[str, str] = {
    "sequence_parallel": "--sequence-parallel",
    "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
    "cross_entropy_loss_fusion": "--cross-entropy-loss-fusion",
    "moe_grouped_gemm": "--moe-grouped-gemm",
    "moe_permute_fusion": "--moe-permute-fusion",
    "moe_router_fusion": "--moe-router-fusion",
    "moe_shared_expert_overlap": "--moe-shared-expert-overlap",
    "use_distributed_optimizer": "--use-distributed-optimizer",
    "overlap_grad_reduce": "--overlap-grad-reduce",
    "overlap_param_gather": "--overlap-param-gather",
    "use_precision_aware_optimizer": "--use-precision-aware-optimizer",
    "tp_comm_overlap": "--tp-comm-overlap",
    "use_megatron_fsdp": "--use-megatron-fsdp",
    "use_fused_weighted_squared_relu": "--use-fused-weighted-squared-relu",
}
#: Fusions Megatron-LM turns on by default: ``--no-...`` turns them off.
NO_SWITCH_OF_FIELD: dict[str, str] = {
    "bias_dropout_fusion": "--no-bias-dropout-fusion",
    "masked_softmax_fusion": "--no-masked-softmax-fusion",
    "apply_rope_fusion": "--no-rope-fusion",
    "gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
}
VPP_FLAG = "--num-layers-per-virtual-pipeline-stage"
VSTAGES_FLAG = "--num-virtual-stages-per-pipeline-rank"
#: The flex dispatcher's backend (Megatron-LM core_v0.16: ``deepep`` or ``hybridep``; DeepEP
#: is rendered as ``--moe-enable-deepep``, as before that flag existed).
FLEX_BACKEND_FLAG = "--moe-flex-dispatcher-backend"
#: ``semantics.moe_routing`` field (a ``TransformerConfig`` field) -> Megatron-LM flag; a
#: bool field's flag is a switch (Megatron-LM leaves each of them off by default).
ROUTING_FLAG_OF_FIELD: dict[str, str] = {
    "moe_router_load_balancing_type": "--moe-router-load-balancing-type",
    "moe_aux_loss_coeff": "--moe-aux-loss-coeff",
    "moe_router_score_function": "--moe-router-score-function",
    "moe_router_topk_scaling_factor": "--moe-router-topk-scaling-factor",
    "moe_router_enable_expert_bias": "--moe-router-enable-expert-bias",
    "moe_router_dtype": "--moe-router-dtype",
    "moe_router_force_load_balancing": "--moe-router-force-load-balancing",
    "moe_expert_capacity_factor": "--moe-expert-capacity-factor",
    "moe_pad_expert_input_to_capacity": "--moe-pad-expert-input-to-capacity",
}
#: Megatron-LM's validate_args asserts ``--ckpt-format fsdp_dtensor`` with
#: ``--use-megatron-fsdp`` ("Megatron FSDP only supports fsdp_dtensor checkpoint format"):
#: the switch is rendered with it.
FSDP_CKPT_FORMAT = ["--ckpt-format", "fsdp_dtensor"]
#: Knob values dse's built-in trainer cannot apply, refused by name: it wraps the model in
#: Megatron-Core's DistributedDataParallel, never in Megatron FSDP.
BUILTIN_REFUSES: dict[str, str] = {
    "use_megatron_fsdp": "dse's built-in trainer wraps the model in Megatron-Core's "
    "DistributedDataParallel, not Megatron FSDP; run it through a recipe launcher "
    "(megatron_lm with pretrain_gpt.py, bridge or nemo)",
    "data_parallel_sharding_strategy": "Megatron FSDP's sharding, which dse's built-in "
    "trainer does not run (it wraps the model in Megatron-Core's DistributedDataParallel); "
    "run it through a recipe launcher",
}


def builtin_refusal(name: str, value: Any) -> str | None:
    """Why dse's built-in trainer cannot apply ``name=value`` (None when it can): a value
    of :data:`BUILTIN_REFUSES` other than the knob's default."""

    if name in BUILTIN_REFUSES and value not in (None, KNOBS[name].default):
        return BUILTIN_REFUSES[name]
    return None


def _bias_act_flag(model: ModelSpec) -> str:
    return "--no-bias-swiglu-fusion" if model.activation == "swiglu" else "--no-bias-gelu-fusion"


def routing_flags(routing: MoeRouting | None) -> list[str]:
    """``semantics.moe_routing`` as Megatron-LM flags (None: none, Megatron's defaults).

    Every field with a value is given, also at Megatron-LM's default (the routing is pinned,
    not left to the arguments' defaults); None (Megatron-LM's default for those fields) and a
    switch left off pass nothing. A field with no flag in :data:`ROUTING_FLAG_OF_FIELD` is
    refused by name (:class:`NotTaken`) unless it is at its default."""
    out: list[str] = []
    for f, v in routing_fields(routing):
        flag = ROUTING_FLAG_OF_FIELD.get(f)
        if flag is None:
            if v != MoeRouting.model_fields[f].default:
                raise NotTaken(
                    f"semantics.moe_routing.{f}", v, f"no Megatron-LM argument sets {f}"
                )
            continue
        if isinstance(v, bool):
            out += [flag] if v else []
        elif v is not None:
            out += [flag, repr(v) if isinstance(v, float) else str(v)]
    return out


def model_flags(space: SearchSpace) -> list[str]:
    """The space's model and semantics sections as Megatron-LM flags."""
    m, sem = space.model, space.semantics
    out = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
        "--ffn-hidden-size", str(m.ffn_hidden_size),
        "--seq-length", str(sem.seq_length),
        "--max-position-embeddings", str(sem.seq_length),
        "--normalization", m.normalization,
        "--position-embedding-type", m.position_embedding_type,
        # the model's dropout, always given: Megatron-LM's own default is 0.1 on both, which
        # made upstream train another model than the space's (and, with dropout on, the masks
        # depend on the micro-batch shape: the loss of MBS 2 drifted from MBS 1's)
        "--hidden-dropout", repr(float(m.hidden_dropout)),
        "--attention-dropout", repr(float(m.attention_dropout)),
    ]  # fmt: skip
    if m.num_query_groups is not None and m.num_query_groups != m.num_attention_heads:
        out += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    if m.kv_channels is not None:
        out += ["--kv-channels", str(m.kv_channels)]
    if m.multi_latent_attention:
        out.append("--multi-latent-attention")
        if m.q_lora_rank is not None:
            out += ["--q-lora-rank", str(m.q_lora_rank)]
        out += ["--kv-lora-rank", str(m.kv_lora_rank),
                "--qk-head-dim", str(m.qk_head_dim),
                "--qk-pos-emb-head-dim", str(m.qk_pos_emb_head_dim),
                "--v-head-dim", str(m.v_head_dim)]  # fmt: skip
    if m.qk_layernorm:
        out.append("--qk-layernorm")
    if m.activation == "swiglu":
        out.append("--swiglu")
    elif m.activation == "squared_relu":
        out.append("--squared-relu")
    if not m.add_bias_linear:
        out.append("--disable-bias-linear")
    if m.untie_embeddings_and_output_weights:
        out.append("--untie-embeddings-and-output-weights")
    if m.num_moe_experts is not None:
        out += ["--num-experts", str(m.num_moe_experts), "--moe-router-topk",
                str(m.moe_router_topk)]  # fmt: skip
        if m.moe_ffn_hidden_size is not None:
            out += ["--moe-ffn-hidden-size", str(m.moe_ffn_hidden_size)]
        if m.moe_shared_expert_intermediate_size is not None:
            out += ["--moe-shared-expert-intermediate-size",
                    str(m.moe_shared_expert_intermediate_size)]  # fmt: skip
        if m.moe_layer_freq != 1:
            # Megatron-LM's --moe-layer-freq takes an int or a Python list expression
            freq = m.moe_layer_freq
            text = str(freq) if isinstance(freq, int) else "[" + ",".join(map(str, freq)) + "]"
            out += ["--moe-layer-freq", text]
        out += routing_flags(sem.moe_routing)
    if sem.precision in ("bf16", "fp16"):
        out.append(f"--{sem.precision}")
    out += [
        "--global-batch-size", str(sem.global_batch_size),
        "--train-iters", str(space.measurement.steps(sem.steps)),
        "--lr", repr(sem.lr),
        # semantics.lr is one constant rate (the built-in trainer has no schedule);
        # Megatron-LM's default decays it linearly to 0 over --train-iters
        "--lr-decay-style", "constant",
        "--seed", str(sem.seed),
        "--log-interval", "1",
    ]  # fmt: skip
    # mock: the same dataset on both sides; synthetic: upstream has no uniform random
    # stream, it trains on its mock dataset (the same shapes and cost, another loss curve)
    if sem.data.kind in ("synthetic", "mock"):
        out += ["--mock-data", "--tokenizer-type", "NullTokenizer",
                "--vocab-size", str(m.vocab_size - NULL_TOKENIZER_EXTRA)]  # fmt: skip
    return out


#: Megatron-LM's NullTokenizer adds its end-of-document token after ``--vocab-size`` ids
#: (``_NullTokenizer``: ``eod = vocab_size``, ``vocab_size + 1`` entries): the flag is the
#: model's vocabulary less this, so that upstream's embedding has ``model.vocab_size`` rows
#: (padded as the built-in trainer pads them) and not one more (1024 -> 1152 padded rows on
#: the tiny GPT, 32000 -> 32128 on the 0.9B model).
NULL_TOKENIZER_EXTRA = 1

#: The built-in trainer's Megatron-LM entry point (dse.workloads.megatron.mlm).
BUILTIN_MODULE = "dse.workloads.megatron.mlm"


def knob_flags(params: Mapping[str, Any], model: ModelSpec, *, builtin: bool = False) -> list[str]:
    """Megatron-LM flags for the knob values of ``params`` (raises NotTaken).

    ``builtin``: the command runs dse's built-in trainer (:data:`BUILTIN_MODULE`), which also
    takes dse's own values (``attention_backend=sdpa``: ``--transformer-impl local
    --attention-backend flash``, the fields of that knob value).
    """
    out: list[str] = []
    seen: set[str] = set()
    pp = int(params.get("pipeline_model_parallel_size", 1) or 1)
    flex = params.get("moe_token_dispatcher_type") == "flex"
    items = Launcher.assignments_of(params)
    # a field set twice (recompute's default modules, then recompute_modules) takes its last
    # value, at the place of its first flag, as Bridge's and NeMo's overrides do
    last = {a.field: (name, value, a) for name, value, a in items}
    for name, value, a in items:
        why = builtin_refusal(name, value) if builtin else dse_only(name, value)
        if why:
            raise NotTaken(name, value, why)
        if a.field in seen:
            continue
        seen.add(a.field)
        name, value, a = last[a.field]
        f, v = a.field, a.value
        if f == "virtual_pipeline_model_parallel_size":
            if v is None:
                continue
            if not PipelineSplit.from_params(params).is_even:
                # an uneven split or a layout: the chunk count itself (Megatron-LM's
                # --num-layers-per-virtual-pipeline-stage assumes equal stages)
                out += [VSTAGES_FLAG, str(v)]
                continue
            if model.num_layers % (pp * int(v)):
                raise NotTaken(name, value, f"{model.num_layers} layers do not split into "
                               f"PP={pp} x VPP={v} equal stages")  # fmt: skip
            out += [VPP_FLAG, str(model.num_layers // (pp * int(v)))]
        elif f == "bias_activation_fusion":
            if not v:
                out.append(_bias_act_flag(model))
        elif f in NO_SWITCH_OF_FIELD:
            if not v:
                out.append(NO_SWITCH_OF_FIELD[f])
        elif f == "use_megatron_fsdp":
            if v:
                out += [SWITCH_OF_FIELD[f], *FSDP_CKPT_FORMAT]
        elif f in SWITCH_OF_FIELD:
            if v:
                out.append(SWITCH_OF_FIELD[f])
        elif f == "grad_reduce_in_fp32":
            out.append("--accumulate-allreduce-grads-in-fp32" if v else "--grad-reduce-in-bf16")
        elif f == "moe_flex_dispatcher_backend":
            if not flex:
                continue  # no effect without the flex dispatcher
            if v == "deepep":
                out.append("--moe-enable-deepep")
            else:
                out += [FLEX_BACKEND_FLAG, str(v)]
        elif f in FLAG_OF_FIELD:
            if v is None or (f == "cuda_graph_scope" and v == "full"):  # the default: whole layers
                continue
            flag = FLAG_OF_FIELD[f]
            out += [flag, *map(str, v)] if isinstance(v, list) else [flag, str(v)]
        elif value == _catalog_default(name):
            # no flag, and Megatron-LM builds the field at this default without one: passing
            # nothing runs the same (only a value that changes what runs is refused)
            continue
        else:
            raise NotTaken(name, value, f"no Megatron-LM argument sets {a.section}.{f}")
    return out


def _catalog_default(name: str) -> Any:
    """Megatron-Core's default of knob ``name`` (a sentinel no value equals for env knobs)."""

    knob = KNOBS.get(name)
    return knob.default if knob is not None and knob.default is not None else object()


class MegatronLMLauncher(Launcher):
    name = "megatron_lm"
    log_format = "megatron"

    def entry(self, python: str | None) -> list[str]:
        head = self.torchrun(python)
        if self.spec.module:
            head += ["-m", self.spec.module]
        else:
            head.append(self.spec.script or "pretrain_gpt.py")
        return head + list(self.spec.args)

    def knob_overrides(self, params: Mapping[str, Any]) -> list[str]:
        return knob_flags(params, self.space.model, builtin=self.spec.module == BUILTIN_MODULE)

    def semantics_overrides(self) -> list[str]:
        sem = self.space.semantics
        if self.spec.module != BUILTIN_MODULE:
            if sem.peft is not None:
                raise NotTaken(
                    "semantics.peft",
                    sem.peft.scheme,
                    "Megatron-LM's pretrain_gpt.py has no PEFT (LoRA is Megatron-Bridge's "
                    "megatron.bridge.peft.lora.LoRA and NeMo's llm.peft.LoRA); use the bridge "
                    "or nemo launcher, or dse's built-in trainer",
                )
            if sem.packed_sequences:
                raise NotTaken(
                    "semantics.packed_sequences",
                    True,
                    "Megatron-LM's pretrain_gpt.py trains full rows of its GPT dataset (no "
                    "packed SFT data); use a Bridge or NeMo packed-SFT recipe",
                )
        if self.spec.model_args:
            return model_flags(self.space)
        # the recipe's arguments give the model; a routing the study declares is applied
        return routing_flags(self.space.semantics.moe_routing)

    def fixed_overrides(self) -> list[str]:
        out: list[str] = []
        for k, v in self.spec.overrides.items():
            flag = k if k.startswith("--") else "--" + k.replace("_", "-")
            if v is True:
                out.append(flag)
            elif v is False or v is None:
                continue
            elif isinstance(v, list):
                out += [flag, *map(str, v)]
            else:
                out += [flag, str(v)]
        return out

    def render(self, params: Mapping[str, Any], *, python: str | None = None) -> Any:
        r = super().render(params, python=python)
        self._no_repeats(r.argv)
        self._routing_not_overridden(r.argv)
        return r

    def _routing_not_overridden(self, argv: Sequence[str]) -> None:
        """A routing flag the declared ``semantics.moe_routing`` leaves out (a None value, a
        switch off) must not come from the base args or fixed overrides either."""

        routing = self.space.semantics.moe_routing
        if routing is None:
            return
        own = set(routing_flags(routing))
        other = sorted({a for a in argv if a in ROUTING_FLAG_OF_FIELD.values()} - own)
        if other:
            raise SpaceError(
                f"workload.launcher: {other} set by the base args or fixed overrides, while "
                "semantics.moe_routing holds the routing fixed; give it there"
            )

    def _no_repeats(self, argv: Sequence[str]) -> None:
        flags = [a for a in argv if a.startswith("--") and "=" not in a]
        dup = sorted({f for f in flags if flags.count(f) > 1} - {"--standalone"})
        if dup:
            raise SpaceError(
                f"workload.launcher: {dup} given more than once (base args, fixed overrides, "
                "the model section and the knobs must not repeat a flag)"
            )

    def _is_key(self, item: str) -> bool:
        return item.startswith("--")


# --- the resolved-configuration check ------------------------------------------------

#: Catalog fields whose Megatron-LM argument (its ``args`` attribute, as the argument table
#: prints it) has another name.
_DEST_OF_FIELD: dict[str, str] = {
    "grad_reduce_in_fp32": "accumulate_allreduce_grads_in_fp32",
}
#: ``TransformerConfig`` fields whose Megatron-LM argument default differs from the
#: dataclass's own (Megatron-LM's ``arguments.py`` excludes them from its dataclass-built
#: arguments as "incompatible defaults in dataclass") and that no dse knob sets: the built-in
#: trainer takes Megatron-LM's value, so that it builds the model upstream builds. Megatron-LM
#: prints ``attention_softmax_in_fp32 False`` (only ``--attention-softmax-in-fp32`` or
#: ``--apply-query-key-layer-scaling`` turn it on); the dataclass says True, which makes the
#: local spec's unfused attention upcast every ``[b, heads, s, s]`` score tensor to fp32 and
#: keep the fp32 softmax output for the backward pass.
MEGATRON_LM_MODEL_DEFAULTS: dict[str, Any] = {"attention_softmax_in_fp32": False}
#: ``DistributedDataParallelConfig`` fields Megatron-LM's ``get_model`` sets from its own
#: arguments at their defaults, where the dataclass default differs: the NaN check of every
#: gradient bucket before the data-parallel reduce (``--check-for-nan-in-loss-and-grad``, on
#: by default; ``check_for_nan_in_grad=args.check_for_nan_in_loss_and_grad``).
MEGATRON_LM_DDP_DEFAULTS: dict[str, Any] = {"check_for_nan_in_grad": True}

#: What an argument Megatron-LM leaves None means (Megatron-Core's TransformerConfig default).
ARG_DEFAULTS: dict[str, Any] = {"recompute_modules": ["core_attn"]}
#: Flags of the model and semantics sections (:func:`model_flags`) whose value the argument
#: table must show as given: flag -> argument name. Switches are True when given.
_MODEL_VALUE_FLAGS = (
    "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
    "--seq-length", "--max-position-embeddings", "--normalization", "--position-embedding-type",
    "--num-query-groups", "--kv-channels", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--global-batch-size",
    "--train-iters", "--lr", "--seed", "--vocab-size", "--hidden-dropout",
    "--attention-dropout", "--lr-decay-style",
)  # fmt: skip
_MODEL_SWITCHES = {
    "--group-query-attention": ("group_query_attention", True),
    "--swiglu": ("swiglu", True),
    "--squared-relu": ("squared_relu", True),
    "--disable-bias-linear": ("add_bias_linear", False),
    "--untie-embeddings-and-output-weights": ("untie_embeddings_and_output_weights", True),
    "--bf16": ("bf16", True),
    "--fp16": ("fp16", True),
    "--mock-data": ("mock_data", True),
}


def resolved_expectations(
    params: Mapping[str, Any], model: ModelSpec, argv: Sequence[str] = ()
) -> dict[str, Any]:
    """What Megatron-LM's argument table must show for a trial: argument name -> the value
    dse asked, for every field its knob values set (also the ones left at Megatron-LM's
    default, which render no flag) and every model/semantics flag of ``argv`` (the rendered
    command, the MoE routing of ``semantics.moe_routing`` included). Compared with
    :func:`dse.workloads.launchers.resolved.compare`."""
    out: dict[str, Any] = {}
    flex = params.get("moe_token_dispatcher_type") == "flex"
    for _name, _value, a in Launcher.assignments_of(params):
        f, v = a.field, a.value
        if f == "bias_activation_fusion":
            dest = "bias_swiglu_fusion" if model.activation == "swiglu" else "bias_gelu_fusion"
            out[dest] = v
        elif f == "virtual_pipeline_model_parallel_size":
            out[f] = None if v in (None, 1) else v  # validate_args keeps None for one stage
        elif f == "moe_flex_dispatcher_backend":
            if flex:
                out["moe_enable_deepep"] = v == "deepep"
                if v != "deepep":
                    out[f] = v
        elif f == "recompute_modules" and params.get("recompute") != "selective":
            continue  # Megatron-LM reads the list only with selective recompute
        elif f in ("recompute_method", "recompute_num_layers") and v is None:
            continue
        elif f == "cuda_graph_scope" and v == "full":
            continue  # no flag rendered: Megatron-LM's own default (whole layers)
        else:
            out[_DEST_OF_FIELD.get(f, f)] = v
    args = list(argv)
    for i, tok in enumerate(args):
        if tok in _MODEL_VALUE_FLAGS and i + 1 < len(args):
            out[_dest(tok)] = args[i + 1]
        elif tok in _MODEL_SWITCHES:
            dest, val = _MODEL_SWITCHES[tok]
            out[dest] = val
        elif tok in _ROUTING_FIELD_OF_FLAG:
            # semantics.moe_routing: the table prints the field under its own name; Megatron-LM
            # takes the load-balancing type and the aux-loss coefficient as lists and its
            # validate_args turns a one-element list back into the value before printing
            f = _ROUTING_FIELD_OF_FLAG[tok]
            if isinstance(MoeRouting.model_fields[f].default, bool):
                out[f] = True
            elif i + 1 < len(args):
                out[f] = args[i + 1]
    return out


_ROUTING_FIELD_OF_FLAG = {flag: f for f, flag in ROUTING_FLAG_OF_FIELD.items()}


# --- reading a Megatron-LM command line back --------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_gpt.py (dse built-in trainer)", allow_abbrev=False)
    a = p.add_argument
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                 "--seq-length", "--max-position-embeddings", "--num-query-groups",
                 "--kv-channels", "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                 "--moe-shared-expert-intermediate-size", "--global-batch-size", "--train-iters",
                 "--seed", "--log-interval", "--vocab-size", VPP_FLAG,
                 VSTAGES_FLAG, "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
                 "--qk-pos-emb-head-dim", "--v-head-dim"):  # fmt: skip
        a(flag, type=int)
    a("--moe-layer-freq")
    a("--lr", type=float)
    a("--hidden-dropout", type=float, default=0.0)
    a("--attention-dropout", type=float, default=0.0)
    # the built-in trainer has one constant learning rate: another schedule is refused
    a("--lr-decay-style", choices=["constant"], default="constant")
    a("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    a("--position-embedding-type", default="learned_absolute",
      choices=["learned_absolute", "rope", "none"])  # fmt: skip
    a("--tokenizer-type")
    a(FLEX_BACKEND_FLAG, choices=["deepep", "hybridep"])
    for sw in ("--group-query-attention", "--swiglu", "--squared-relu", "--disable-bias-linear",
               "--untie-embeddings-and-output-weights", "--bf16", "--fp16", "--mock-data",
               "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16",
               "--moe-enable-deepep", "--no-bias-swiglu-fusion", "--no-bias-gelu-fusion",
               "--multi-latent-attention", "--qk-layernorm",
               *SWITCH_OF_FIELD.values(), *NO_SWITCH_OF_FIELD.values()):  # fmt: skip
        a(sw, action="store_true")
    for f, flag in ROUTING_FLAG_OF_FIELD.items():
        default = MoeRouting.model_fields[f].default
        if isinstance(default, bool):
            a(flag, action="store_true")
        elif f in ("moe_router_load_balancing_type", "moe_router_score_function",
                   "moe_router_dtype"):  # fmt: skip
            a(flag)
        else:
            a(flag, type=float)
    for f, flag in FLAG_OF_FIELD.items():
        if f in ("recompute_modules", "cuda_graph_scope"):
            a(flag, nargs="*")
        elif f.endswith("_size") or f == "recompute_num_layers" or f.startswith("num_layers_in_"):
            a(flag, type=int)
        else:
            a(flag)
    return p


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _model_vocab(flag: int | None, tokenizer: str | None) -> int | None:
    """The model's vocabulary of ``--vocab-size`` (NullTokenizer adds its end-of-document id)."""
    if flag is None:
        return None
    return flag + (NULL_TOKENIZER_EXTRA if tokenizer == "NullTokenizer" else 0)


def parse_megatron_args(argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any], dict]:
    """(model, semantics, knob values) of a Megatron-LM command line.

    Knob values follow Megatron-LM's defaults: a fusion without its ``--no-...`` flag is on.
    Raises SystemExit (argparse) for an unknown flag, as Megatron-LM does.
    """
    ns = vars(_parser().parse_args(list(argv)))

    def g(flag: str) -> Any:
        return ns[_dest(flag)]

    act = "swiglu" if g("--swiglu") else "squared_relu" if g("--squared-relu") else "gelu"
    model: dict[str, Any] = {
        "num_layers": g("--num-layers"),
        "hidden_size": g("--hidden-size"),
        "num_attention_heads": g("--num-attention-heads"),
        "num_query_groups": g("--num-query-groups") if g("--group-query-attention") else None,
        "ffn_hidden_size": g("--ffn-hidden-size") or 4 * (g("--hidden-size") or 0),
        "vocab_size": _model_vocab(g("--vocab-size"), g("--tokenizer-type")),
        "hidden_dropout": g("--hidden-dropout"),
        "attention_dropout": g("--attention-dropout"),
        "kv_channels": g("--kv-channels"),
        "activation": act,
        "normalization": g("--normalization"),
        "position_embedding_type": g("--position-embedding-type"),
        "add_bias_linear": not g("--disable-bias-linear"),
        "untie_embeddings_and_output_weights": g("--untie-embeddings-and-output-weights"),
        "qk_layernorm": g("--qk-layernorm"),
    }
    if g("--multi-latent-attention"):
        mla = {"q_lora_rank": g("--q-lora-rank"), "kv_lora_rank": g("--kv-lora-rank"),
               "qk_head_dim": g("--qk-head-dim"),
               "qk_pos_emb_head_dim": g("--qk-pos-emb-head-dim"),
               "v_head_dim": g("--v-head-dim")}  # fmt: skip
        # Megatron-LM's --q-lora-rank defaults to None (one full query projection)
        model.update(multi_latent_attention=True, q_lora_rank=mla.pop("q_lora_rank"))
        model.update({k: v for k, v in mla.items() if v is not None})
    if g("--num-experts"):
        model.update(
            num_moe_experts=g("--num-experts"),
            moe_router_topk=g("--moe-router-topk") or 2,
            moe_ffn_hidden_size=g("--moe-ffn-hidden-size"),
            moe_shared_expert_intermediate_size=g("--moe-shared-expert-intermediate-size"),
        )
        if g("--moe-layer-freq"):  # an int, or Megatron-LM's list expression "[0,1,...]"
            text = str(g("--moe-layer-freq")).strip()
            model["moe_layer_freq"] = (
                [int(x) for x in text.strip("[]").split(",") if x.strip()]
                if text.startswith("[")
                else int(text)
            )
    precision = "bf16" if g("--bf16") else "fp16" if g("--fp16") else "fp32"
    semantics: dict[str, Any] = {
        "global_batch_size": g("--global-batch-size"),
        "seq_length": g("--seq-length"),
        "steps": g("--train-iters"),
        "precision": precision,
    }
    if g("--lr") is not None:
        semantics["lr"] = g("--lr")
    if g("--seed") is not None:
        semantics["seed"] = g("--seed")
    routing = {
        f: g(flag)
        for f, flag in ROUTING_FLAG_OF_FIELD.items()
        if g(flag) is not None and g(flag) is not False
    }
    if routing:  # every field not given at Megatron-LM's default
        semantics["moe_routing"] = routing

    fields: dict[str, Any] = {}
    for f, flag in FLAG_OF_FIELD.items():
        if g(flag) is not None:
            fields[f] = g(flag)
    for f, flag in SWITCH_OF_FIELD.items():
        fields[f] = bool(g(flag))
    for f, flag in NO_SWITCH_OF_FIELD.items():
        fields[f] = not g(flag)
    fields["bias_activation_fusion"] = not (
        g("--no-bias-swiglu-fusion") or g("--no-bias-gelu-fusion")
    )
    fields["grad_reduce_in_fp32"] = not g("--grad-reduce-in-bf16")
    if g(VSTAGES_FLAG):
        fields["virtual_pipeline_model_parallel_size"] = g(VSTAGES_FLAG)
    if g(FLEX_BACKEND_FLAG) or g("--moe-enable-deepep"):
        fields["moe_flex_dispatcher_backend"] = g(FLEX_BACKEND_FLAG) or "deepep"
    if g(VPP_FLAG):
        pp = fields.get("pipeline_model_parallel_size", 1)
        fields["virtual_pipeline_model_parallel_size"] = model["num_layers"] // (pp * g(VPP_FLAG))
    return model, semantics, knobs_from_fields(fields)


def knobs_from_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Knob values whose field assignments are those of ``fields`` (Megatron-LM defaults
    for the rest): the inverse of the catalog's field mapping for one command line."""

    out: dict[str, Any] = {}
    for name, knob in KNOBS.items():
        if knob.kind in ("int", "text"):
            fas = knob.fields(1)
            if fas and fas[0].field in fields:
                out[name] = fields[fas[0].field]
            continue
        candidates = [False, True] if knob.kind == "bool" else list(knob.choices)
        for v in candidates:
            fas = knob.fields(v)
            if fas and all(fa.field in fields and fields[fa.field] == fa.value for fa in fas):
                out[name] = v
                break
    if "recompute_granularity" not in fields:
        out["recompute"] = "none"
    if fields.get("transformer_impl") == "local" and fields.get("attention_backend") in (
        None,
        "local",
    ):
        out["attention_backend"] = "unfused"
    return out
