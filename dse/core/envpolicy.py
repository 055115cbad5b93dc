"""The environment policy: which variables a space (or an import) may put into a trial.

One rule for every place a variable enters a trial's processes: ``env.fixed``, ``env.knobs``
(knobs named ``env.VAR``), ``runner.options.env`` of the Ray and Slurm runners, and the
``extra_env_vars`` of an imported CloudAI scenario. A name is refused when

- it is not a shell identifier (letters, digits and ``_``, not starting with a digit): the
  Slurm batch script exports it (``export NAME=...``), and a name with ``=``, a space, ``;``
  or a newline would be shell text, not a name;
- its value tells a program which code to load or run (the dynamic loader, an interpreter's
  search paths and start-up files, ``PATH``, the shell's start-up file, plugins NCCL or CUDA
  load into every rank): such a variable runs code of the space's choosing in every process
  of the trial, even in programs that never read the space;
- dse, torchrun or Slurm sets it for the trial (ranks, rendezvous, devices, ``srun``'s
  input variables): a value from the space would break the trial or, for ``SLURM_*``, change
  what ``srun`` runs (``SLURM_TASK_PROLOG`` starts a program).

Everything else is kept (``NCCL_*`` tuning, ``NVTE_*``, ``CUDA_DEVICE_MAX_CONNECTIONS``,
``ENABLE_NUMA_CONTROL``, ``TORCHX_MAX_RETRIES``, ``TRANSFORMERS_OFFLINE``,
``NEMO_LOG_MEMORY_USAGE``, ...): a recipe's environment is its own business. Each refusal
states its reason (:func:`env_var_problem`).
"""

from __future__ import annotations

import re

__all__ = ["IDENTIFIER", "REFUSED_NAMES", "REFUSED_PREFIXES", "env_var_problem", "check_env"]

#: An environment variable name the batch shell can export: a POSIX shell identifier.
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_LOADS = "it names code every process of the trial loads or runs"

#: Whole names refused, with the reason.
REFUSED_NAMES: dict[str, str] = {
    "PATH": f"{_LOADS} (the programs found by name: torchrun, python, srun)",
    "HOME": f"{_LOADS} (the interpreter's user site-packages under ~/.local, tools' "
    "configuration files)",
    "BASH_ENV": f"{_LOADS} (bash runs this file before every non-interactive script, the "
    "batch script included)",
    "ENV": f"{_LOADS} (sh runs this file at start-up)",
    "SHELLOPTS": "it changes how the batch shell parses the script",
    "BASHOPTS": "it changes how the batch shell parses the script",
    "IFS": "it changes how the batch shell splits words",
    "PS4": "bash expands it (command substitution included) for every traced line",
    "PROMPT_COMMAND": f"{_LOADS} (bash runs it)",
    "GCONV_PATH": f"{_LOADS} (glibc loads character-set modules from it)",
    "NCCL_NET_PLUGIN": f"{_LOADS} (a network library NCCL loads into every rank)",
    "NCCL_TUNER_PLUGIN": f"{_LOADS} (a tuner library NCCL loads into every rank)",
    "NCCL_PROFILER_PLUGIN": f"{_LOADS} (a profiler library NCCL loads into every rank)",
    "NCCL_ENV_PLUGIN": f"{_LOADS} (a library NCCL loads to set its environment)",
    "NCCL_CONF_FILE": "NCCL reads further variables from this file (NCCL_NET_PLUGIN among "
    "them), past this policy",
    "CUDA_INJECTION64_PATH": f"{_LOADS} (a library the CUDA driver injects into the process)",
    "CUDA_INJECTION32_PATH": f"{_LOADS} (a library the CUDA driver injects into the process)",
    "OPENSSL_CONF": f"{_LOADS} (OpenSSL loads the engines and providers it names)",
    "NODE_OPTIONS": f"{_LOADS} (options of every node interpreter: --require)",
    "CUDA_VISIBLE_DEVICES": "the runner assigns each trial its devices",
    "MASTER_ADDR": "torchrun and the runner set the rendezvous",
    "MASTER_PORT": "torchrun and the runner set the rendezvous",
    "RANK": "torchrun sets it for each rank",
    "LOCAL_RANK": "torchrun sets it for each rank",
    "WORLD_SIZE": "torchrun sets it for each rank",
    "LOCAL_WORLD_SIZE": "torchrun sets it for each rank",
    "GROUP_RANK": "torchrun sets it for each rank",
}

#: Name prefixes refused, with the reason.
REFUSED_PREFIXES: dict[str, str] = {
    "LD_": f"{_LOADS} (the dynamic loader: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT)",
    "DYLD_": f"{_LOADS} (the dynamic loader)",
    "PYTHON": f"{_LOADS} (the Python interpreter: PYTHONPATH, PYTHONSTARTUP, PYTHONHOME)",
    "PERL5": f"{_LOADS} (the perl interpreter's search path and options)",
    "RUBY": f"{_LOADS} (the ruby interpreter's search path and options)",
    "BASH_FUNC_": f"{_LOADS} (bash imports it as a shell function)",
    "SLURM_": "Slurm sets it, and srun reads it as its own options (SLURM_TASK_PROLOG runs "
    "a program)",
    "SRUN_": "srun reads it as its own options",
    "SBATCH_": "sbatch reads it as its own options",
    "SALLOC_": "salloc reads it as its own options",
    "TORCHELASTIC_": "torchrun sets it for each rank",
    "DSE_": "dse's own variables (the trial's owner token, the API token, the storage URL)",
}


def env_var_problem(name: str) -> str | None:
    """Why ``name`` may not be set in a trial's environment, or None when it may."""
    if not IDENTIFIER.fullmatch(name):
        return (
            f"{name!r} is not an environment variable name (letters, digits and '_', not "
            "starting with a digit): the batch script would run it as shell text"
        )
    why = REFUSED_NAMES.get(name)
    if why is None:
        why = next((r for p, r in REFUSED_PREFIXES.items() if name.startswith(p)), None)
    if why is None:
        return None
    return f"{name!r} may not be set in a trial's environment: {why}"


def check_env(env: dict[str, object], where: str) -> None:
    """Raise ValueError naming ``where`` and the variable when ``env`` breaks the policy
    (a name refused, or a value holding a NUL character, which no environment can carry)."""
    for name, value in env.items():
        why = env_var_problem(name)
        if why is not None:
            raise ValueError(f"{where}: {why}")
        if isinstance(value, str) and "\0" in value:
            raise ValueError(f"{where}.{name}: a value must not contain a NUL character")
