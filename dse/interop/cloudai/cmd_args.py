"""The ``cmd_args`` tables of CloudAI's workload templates that dse reads, as typed models.

One model per template: :class:`NeMoRunArgs` (CloudAI's ``NeMoRunCmdArgs``: ``trainer``,
``trainer.strategy``, ``trainer.plugins``, ``data``, ``optim.config``) and
:class:`MegatronBridgeArgs` (``MegatronBridgeCmdArgs``, the flat launcher flags). The fields dse
reads are typed; a field CloudAI's DSE may sweep is a value or a list of values (a sweep);
every other field is allowed and kept as written (a newer CloudAI file still imports, its
unknown fields listed as not mapped or passed on as the recipe's overrides, as before).

:func:`validate_cmd_args` checks a test's flattened ``cmd_args`` against its template's model
and refuses a bad value with a :class:`~dse.core.exceptions.SpaceError` that names the file,
the field (``cmd_args.trainer.strategy.tensor_model_parallel_size``) and what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError
from pydantic_core import PydanticCustomError

from dse.core.exceptions import SpaceError

_INT_TEXT = re.compile(r"[+-]?\d+")


def _integer(least: int | None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool):
            raise TypeError(f"must be an integer, got {v!r}")
        if isinstance(v, int):
            n = v
        elif isinstance(v, float) and v.is_integer():
            n = int(v)
        elif isinstance(v, str) and _INT_TEXT.fullmatch(v.strip()):
            n = int(v.strip())  # CloudAI's models read "4" as 4 too
        else:
            raise TypeError(f"must be an integer, got {v!r}")
        if least is not None and n < least:
            raise ValueError(f"must be at least {least}, got {n}")
        return n

    return check


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"must be a number, got {v!r}")
    return float(v)


def _boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise TypeError(f"must be true or false, got {v!r}")


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"must be text, got {v!r}")
    return v


def _single(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def validate(v: Any) -> Any:
        try:
            return check(v)
        except (TypeError, ValueError) as e:
            raise PydanticCustomError("cloudai_value", "{why}", {"why": str(e)}) from None

    return validate


def _sweep(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A value, or a list of values: a sweep of CloudAI's DSE."""

    def validate(v: Any) -> Any:
        if not isinstance(v, list):
            try:
                return check(v)
            except ValueError as e:
                raise PydanticCustomError("cloudai_value", "{why}", {"why": str(e)}) from None
            except TypeError as e:
                why = f"{e} (a value, or a list of values to sweep)"
                raise PydanticCustomError("cloudai_value", "{why}", {"why": why}) from None
        out = []
        for i, x in enumerate(v):
            try:
                out.append(check(x))
            except (TypeError, ValueError) as e:
                why = f"item {i} of the sweep {v!r} {e}"
                raise PydanticCustomError("cloudai_value", "{why}", {"why": why}) from None
        return out

    return validate


#: A parallel size, batch size or length (an integer >= 1), or a sweep of them.
Size = Annotated[Any, PlainValidator(_sweep(_integer(1)))]
#: A layer count (an integer >= 0), or a sweep of them.
Count = Annotated[Any, PlainValidator(_sweep(_integer(0)))]
Flag = Annotated[Any, PlainValidator(_sweep(_boolean))]
Text = Annotated[Any, PlainValidator(_sweep(_text))]
Number = Annotated[Any, PlainValidator(_sweep(_number))]
OnePositive = Annotated[Any, PlainValidator(_single(_integer(1)))]
OneCount = Annotated[Any, PlainValidator(_single(_integer(0)))]
OneFlag = Annotated[Any, PlainValidator(_single(_boolean))]
OneText = Annotated[Any, PlainValidator(_single(_text))]


class _Table(BaseModel):
    """A table of a CloudAI test: its other fields allowed and kept as written."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


# --- NeMoRun (CloudAI's NeMoRunCmdArgs) ------------------------------------------------------


class NeMoRunStrategy(_Table):
    """``trainer.strategy``: NeMo's MegatronStrategy sizes."""

    tensor_model_parallel_size: Size = None
    pipeline_model_parallel_size: Size = None
    context_parallel_size: Size = None
    virtual_pipeline_model_parallel_size: Size = None
    expert_model_parallel_size: Size = None
    expert_tensor_parallel_size: Size = None
    sequence_parallel: Flag = None
    num_layers_in_first_pipeline_stage: Count = None
    num_layers_in_last_pipeline_stage: Count = None
    account_for_embedding_in_pipeline_split: Flag = None
    account_for_loss_in_pipeline_split: Flag = None
    pipeline_model_parallel_layout: Text = None


class NeMoRunPlugins(_Table):
    """``trainer.plugins``: NeMo's precision plugin."""

    fp8: Text = None
    fp8_recipe: Text = None
    fp8_params: Flag = None
    fp8_margin: OneCount = None
    fp8_amax_history_len: OnePositive = None
    fp8_amax_compute_algo: OneText = None
    fp8_wgrad: OneFlag = None
    grad_reduce_in_fp32: Flag = None


class NeMoRunTrainer(_Table):
    max_steps: Size = None
    num_nodes: OnePositive = None
    strategy: NeMoRunStrategy | None = None
    plugins: NeMoRunPlugins | None = None


class NeMoRunData(_Table):
    seq_length: Size = None
    micro_batch_size: Size = None
    global_batch_size: Size = None


class NeMoRunOptimConfig(_Table):
    use_distributed_optimizer: Flag = None
    use_precision_aware_optimizer: Flag = None


class NeMoRunOptim(_Table):
    config: NeMoRunOptimConfig | None = None


class NeMoRunArgs(_Table):
    """CloudAI's NeMoRun ``cmd_args``: NeMo 2.0 recipes through ``nemo llm TASK``."""

    docker_image_url: OneText = None
    task: OneText = None
    recipe_name: OneText = None
    num_layers: Size = None
    hidden_size: Size = None
    hf_token: OneText = None
    trainer: NeMoRunTrainer | None = None
    data: NeMoRunData | None = None
    optim: NeMoRunOptim | None = None


# --- MegatronBridge (CloudAI's MegatronBridgeCmdArgs) -----------------------------------------


class MegatronBridgeArgs(_Table):
    """CloudAI's MegatronBridge ``cmd_args``: Megatron-Bridge's performance launcher flags."""

    # the recipe
    model_family_name: OneText = None
    model_recipe_name: OneText = None
    model_name: OneText = None  # CloudAI's older names of the two above
    model_size: OneText = None
    task: OneText = None
    domain: OneText = None
    use_recipes: OneFlag = None
    config_variant: OneText = None
    container_image: OneText = None
    hf_token: OneText = None
    # the world
    gpu_type: OneText = None
    num_gpus: OnePositive = None
    gpus_per_node: OnePositive = None  # the older schema's
    # the model
    num_layers: Size = None
    hidden_size: Size = None
    first_k_dense_replace: Count = None
    # the layout
    tp: Size = None
    pp: Size = None
    cp: Size = None
    vp: Size = None
    ep: Size = None
    et: Size = None
    mb: Size = None
    num_layers_in_first_pipeline_stage: Count = None
    num_layers_in_last_pipeline_stage: Count = None
    account_for_embedding_in_pipeline_split: Flag = None
    account_for_loss_in_pipeline_split: Flag = None
    pipeline_model_parallel_layout: Text = None
    # the training semantics
    gb: Size = None
    seq_length: Size = None
    max_steps: Size = None
    # precision, CUDA graphs, recompute, communication
    compute_dtype: Text = None
    fp8_recipe: OneText = None
    cuda_graph_impl: Text = None
    cuda_graph_scope: Text = None
    recompute_modules: Text = None
    recompute_num_layers: Count = None
    activation_offload_layers: Count = None
    use_megatron_fsdp: Flag = None
    moe_a2a_overlap: Flag = None
    use_tokendrop: Flag = None
    nccl_ub: Flag = None
    enable_vboost: OneFlag = None
    # the optimizer
    lr: Number = None
    min_lr: Number = None
    warmup_iters: Count = None


#: dse's workload name -> the model of its CloudAI template's ``cmd_args``.
CMD_ARGS_MODELS: dict[str, type[BaseModel]] = {
    "nemo": NeMoRunArgs,
    "bridge": MegatronBridgeArgs,
}


def _nest(flat: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Dotted ``cmd_args`` keys (``trainer.strategy.tensor_model_parallel_size``) as tables."""
    out: dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *parts, leaf = key.split(".")
        for i, p in enumerate(parts):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                head = ".".join(parts[: i + 1])
                raise SpaceError(
                    f"{where}: cmd_args.{head} is a value and cmd_args.{key} a field of it"
                )
        if isinstance(node.get(leaf), dict):
            raise SpaceError(f"{where}: cmd_args.{key} is a table and a value")
        node[leaf] = v
    return out


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def validate_cmd_args(
    workload: str, flat: Mapping[str, Any], file_of: Callable[[str], str]
) -> dict[str, Any]:
    """``flat`` (a test's ``cmd_args``, dotted keys) checked against the model of the
    template of ``workload``: the same keys in the same order, the typed fields' values as
    the model reads them (``"4"`` -> 4), the rest as written.

    Raises:
        SpaceError: a field's value is not what the template takes, naming the file that
            gives it (``file_of(key)``), the field and what is wrong; several bad fields
            are named together.
    """
    model = CMD_ARGS_MODELS[workload]
    try:
        got = model.model_validate(_nest(flat, file_of("")))
    except ValidationError as e:
        problems: list[str] = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            why = err["msg"]
            if err["type"] == "model_type":
                why = f"must be a table, got {err['input']!r}"
            problems.append(f"{file_of(key)}: cmd_args.{key} {why}")
        raise SpaceError("; ".join(problems)) from None
    checked = _flat(got.model_dump(exclude_unset=True))
    return {k: checked.get(k, v) for k, v in flat.items()}
