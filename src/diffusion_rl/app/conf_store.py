"""One source of defaults: every config dataclass is stored in Hydra's ConfigStore as ``base_<name>``.

The yaml files under ``conf/`` start from these nodes (``defaults: [base_grpo, _self_]``) and hold
only what differs from the dataclass, each difference commented with why; ``tests/contract/test_conf_store.py``
checks that no yaml restates a default and that each group's base option composes to exactly the
dataclass built in Python with no arguments.

| group | stored as | dataclass |
|---|---|---|
| ``objective``, ``likelihood``, ``advantage``, ``task`` | ``base_<registered name>`` | the registered class's ``config_class`` |
| ``model``, ``sampler``, ``optim``, ``trainer``, ``logger``, ``fault`` | ``base_<group>`` | ``ModelConfig``, ``SamplerConfig``, ... |
| root (``config.yaml``) | ``base_run`` | :class:`~diffusion_rl.app.train.RunConfig` |
| root (``eval.yaml``) | ``base_eval`` | :class:`~diffusion_rl.app.evaluate.EvalRunConfig` (its own keys only) |

The nodes are plain (untyped) copies of the dataclass defaults. Types, ranges and unknown keys are
checked by :func:`diffusion_rl.core.config.from_dict` when a run builds its pieces: a typed Hydra node
would turn a bad command-line value into a multi-line composition error that stops a whole sweep,
where ours is one line that fails only its own job.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from diffusion_rl.app.evaluate import EvalRunConfig
from diffusion_rl.app.train import RunConfig, TrainerConfig
from diffusion_rl.core.registry import Registry
from diffusion_rl.likelihood import LIKELIHOODS
from diffusion_rl.models.policy import ModelConfig
from diffusion_rl.rl.advantages import ADVANTAGES
from diffusion_rl.rl.objectives import OBJECTIVES
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.tasks import TASKS
from diffusion_rl.training.faults import FaultConfig
from diffusion_rl.training.loggers import LoggerConfig
from diffusion_rl.training.module import OptimConfig

# config groups with one dataclass for every option
GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelConfig, "sampler": SamplerConfig, "optim": OptimConfig, "trainer": TrainerConfig,
    "logger": LoggerConfig, "fault": FaultConfig,
}
# config groups whose options are registered classes, each with its own config dataclass
REGISTRIES: dict[str, Registry[Any]] = {"objective": OBJECTIVES, "likelihood": LIKELIHOODS, "advantage": ADVANTAGES, "task": TASKS}


def defaults_of(cls: type, keys: set[str] | None = None) -> dict[str, Any]:
    """The defaults of dataclass ``cls`` as the plain data Hydra holds (tuples as lists; ``keys``: only
    these fields)."""
    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return [plain(x) for x in v] if isinstance(v, list | tuple) else v

    data = plain(dataclasses.asdict(cls()))
    return {k: v for k, v in data.items() if keys is None or k in keys}


def schema(group: str, option: str) -> type:
    """The dataclass that holds the defaults of ``conf/<group>/<option>.yaml``."""
    if group in GROUP_SCHEMAS:
        return GROUP_SCHEMAS[group]
    return REGISTRIES[group].get(option).config_class


MAX_DIRNAME = 120  # characters of a sweep job's folder name kept as written (a file name holds 255 bytes)


def short_dirname(name: str) -> str:
    """A sweep job's folder name (``hydra.job.override_dirname``) that fits a file name: as it is up to
    :data:`MAX_DIRNAME` characters, else its start and a hash of the whole, so that jobs whose long
    names differ only at the end still get folders of their own."""
    if len(name) <= MAX_DIRNAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    return f"{name[:MAX_DIRNAME - len(digest) - 1]}~{digest}"


def register_configs() -> None:
    """Store every ``base_*`` node and the ``short_dirname`` resolver (idempotent); call before Hydra composes."""
    OmegaConf.register_new_resolver("short_dirname", short_dirname, replace=True)
    cs = ConfigStore.instance()
    for group, cls in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=defaults_of(cls))
    for group, registry in REGISTRIES.items():
        for name in registry.names():
            cs.store(group=group, name=f"base_{name}", node=defaults_of(registry.get(name).config_class))
    cs.store(name="base_run", node=defaults_of(RunConfig))
    run_keys = {f.name for f in dataclasses.fields(RunConfig)} - {"eval"}
    eval_keys = {f.name for f in dataclasses.fields(EvalRunConfig)} - run_keys
    cs.store(name="base_eval", node=defaults_of(EvalRunConfig, eval_keys))
