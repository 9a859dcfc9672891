"""``train(cfg)``: warm start, evaluate, RL with Lightning, evaluate again, write the summary.

The Hydra entry point ``src/train.py`` composes the config and calls this; tests call it directly
with a composed config. Returns the summary dict (also written to ``<run_dir>/summary.json``).
Everything a user can get wrong (config values, data files, the checkpoint to resume) is checked
before the first model work, so a mistake costs seconds and one line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from diffusion_rl.app.sources import variant_text
from diffusion_rl.core.config import from_dict, renamed
from diffusion_rl.core.distributed import is_first_process
from diffusion_rl.core.environment import environment
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood import LIKELIHOODS
from diffusion_rl.models.build import base_identity, build_policy
from diffusion_rl.models.policy import ModelConfig, PolicyBundle, check_cache_support
from diffusion_rl.rl.advantages import ADVANTAGES, AdvantageEstimator
from diffusion_rl.rl.objectives import OBJECTIVES, Objective
from diffusion_rl.rl.objectives.base import check_noise
from diffusion_rl.rl.rollout import RolloutConfig, RolloutEngine, check_tree
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.sampling.block import check_block_sampler
from diffusion_rl.sampling.uniform_sampler import check_uniform_sampler
from diffusion_rl.tasks import TASKS, Task, TaskDataModule
from diffusion_rl.training.callbacks import DiagnosticsCallback
from diffusion_rl.training.checkpoint import (
    AtomicCheckpointIO,
    CheckpointRef,
    RunCheckpoint,
    RunRecord,
    check_base,
    continue_csv_log,
    resolve_checkpoint,
)
from diffusion_rl.training.diagnostics import DiagnosticsConfig
from diffusion_rl.training.evaluation import PeriodicEval, expected_warnings_silenced
from diffusion_rl.training.faults import FaultConfig, FaultInjector
from diffusion_rl.training.loggers import ResumePoint, check_loggers, finish_loggers, make_loggers
from diffusion_rl.training.module import DiffusionRLModule, OptimConfig, check_old_policy
from diffusion_rl.training.progress import RLProgressBar
from diffusion_rl.training.rollout_ranks import RolloutGroup, rank_device, serve_rollout_rank
from diffusion_rl.training.strategy import make_strategy
from diffusion_rl.training.warmstart import WarmStartConfig, warm_start

if TYPE_CHECKING:
    from diffusion_rl.app.sources import Sources

log = logging.getLogger(__name__)


@dataclass
class TrainerConfig:
    # optimizer steps, every objective's budget on the embedded model's jobs. On the Sudoku job (GRPO, per-cell
    # credit, 5 RL seeds) validation cell accuracy went 0.922 (200 steps) -> 0.943 (400) -> 0.949 (500)
    max_steps: int = 500
    accelerator: str = "auto"
    devices: Any = 1  # per node
    num_nodes: int = 1  # torchrun --nnodes / SLURM --nodes (docs/real_models.md, "Several nodes")
    strategy: str = "auto"
    strategy_kwargs: dict[str, Any] = field(default_factory=dict)  # training/strategy.py (ddp, fsdp)
    precision: str = "32-true"
    checkpoint_every_n_steps: int = 50
    # step checkpoints kept besides last.ckpt: the newest k (-1: every one, 0: none)
    keep_last_k: int = 2
    enable_progress_bar: bool = True
    # torch's intra-op threads of this process; 0 = torch's default (every core). The experiment grids
    # run 2 jobs at a time with 1 thread each: 2 jobs of 2 threads on 2 cores ran a step 10x slower
    threads: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # passed to lightning.Trainer as is

    def validate(self) -> None:
        if self.max_steps < 1:
            raise ConfigError("trainer.max_steps", self.max_steps, "must be >= 1")
        if self.checkpoint_every_n_steps < 0:
            raise ConfigError("trainer.checkpoint_every_n_steps", self.checkpoint_every_n_steps, "must be >= 0 (0 = only last)")
        if self.keep_last_k < -1:
            raise ConfigError("trainer.keep_last_k", self.keep_last_k, "must be >= -1 (-1 = every checkpoint, 0 = only last)")
        if self.num_nodes < 1:
            raise ConfigError("trainer.num_nodes", self.num_nodes, "must be >= 1")
        if self.threads < 0:
            raise ConfigError("trainer.threads", self.threads, "must be >= 0 (0 = torch's default)")


@dataclass
class EvalConfig:
    before: bool = True  # held-out metrics of the warm start
    after: bool = True  # and of the trained policy
    # and every n optimizer steps during RL, on the validation split (val/* in metrics.csv); 0 = never
    every_n_steps: int = 50
    batch_size: int = 256
    # evaluate with the rollout sampler as it is (its remasking order and fewer-forward options: decode,
    # cache, stop_after_eos); false: the exact low-confidence sampler of docs/methods.md §2, so runs
    # with different rollout samplers share one protocol
    fast_sampler: bool = False
    # keys the random numbers an evaluation still draws (the uniform-noise sampler's canvases, random
    # remasking; greedy masked decoding draws none): another key is another draw of the same evaluation,
    # which measures how far the held-out metrics move with them alone
    noise_key: int = 0

    def validate(self) -> None:
        if self.noise_key < 0:
            raise ConfigError("eval.noise_key", self.noise_key, "must be >= 0")
        if self.every_n_steps < 0:
            raise ConfigError("eval.every_n_steps", self.every_n_steps, "must be >= 0 (0 = only before and after)")
        if self.batch_size < 1:
            raise ConfigError("eval.batch_size", self.batch_size, "must be >= 1")


@dataclass
class PathsConfig:
    # the project's caches (the code sandbox's measured limits, base-weight hashes); relative to the
    # launch folder
    cache_dir: str = "outputs/cache"
    warmstart_dir: str = "${paths.cache_dir}/warmstart"  # warm-start checkpoints, keyed by config


@dataclass
class RunConfig:
    """The root keys of ``conf/config.yaml`` (the config groups have their own dataclasses)."""

    seed: int = 0
    # old policy: copy (a frozen copy) | precomputed (its log-probs taken at rollout time, no copy);
    # "cached" is the deprecated name of precomputed
    old_policy: str = "copy"
    ckpt_path: str | None = None  # resume: last | a run folder | a checkpoint file
    paths: PathsConfig = field(default_factory=PathsConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)  # stands in for the papers' SFT
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)

    def __post_init__(self) -> None:
        if self.old_policy == "cached":
            self.old_policy = renamed("old_policy=cached", "old_policy=precomputed", "precomputed")

    def validate(self) -> None:
        check_old_policy(self.old_policy)


def run_config(cfg: DictConfig, cls: type[RunConfig] = RunConfig) -> RunConfig:
    """The root keys of a composed config as ``cls`` (validated); the config groups are left out."""
    names = {f.name for f in dataclasses.fields(cls)}
    return from_dict(cls, {k: v for k, v in cfg.items() if k in names}, "")


@dataclass
class Components:
    task: Task
    bundle: PolicyBundle
    objective: Objective
    advantage: AdvantageEstimator
    sampler: SamplerConfig
    optim: OptimConfig
    trainer: TrainerConfig
    run: RunConfig


def build_task(task_cfg: Any) -> Task:
    cls = TASKS.get(task_cfg["name"])
    return cls(from_dict(cls.config_class, task_cfg, "task"))


def warm_start_key(cfg: DictConfig) -> dict[str, Any]:
    """What besides ``warmstart.*`` (its seed included) shapes a warm start (its cache key): the model and
    the task's data. The RL seed does not: every RL seed of a comparison shares one warm start, and
    neither do the code tasks' sandbox settings (limits, workers, cache folder: scoring, not training)."""
    task = dict(OmegaConf.to_container(cfg.task, resolve=True))  # type: ignore[arg-type]
    return {"model": OmegaConf.to_container(cfg.model, resolve=True),
            "task": {k: v for k, v in task.items()
                     if k not in ("group_size", "prompts_per_batch", "eval_batch_size", "num_test", "sandbox")}}


def build(cfg: DictConfig, meta: bool = False) -> Components:
    """Validate every config group and build the pieces; any bad value fails here, before work starts.

    ``meta``: the policy's tensors on the ``meta`` device, no memory (an FSDP process other than the
    first, which receives its shards from the first: ``training/strategy.py``)."""
    task = build_task(cfg.task)
    model_cfg = from_dict(ModelConfig, cfg.model, "model")
    lik_cls = LIKELIHOODS.get(cfg.likelihood.name)
    lik_cfg = from_dict(lik_cls.config_class, cfg.likelihood, "likelihood")
    obj_cls = OBJECTIVES.get(cfg.objective.name)
    obj_cfg = from_dict(obj_cls.config_class, cfg.objective, "objective")
    adv_cls = ADVANTAGES.get(cfg.advantage.name)
    adv_cfg = from_dict(adv_cls.config_class, cfg.advantage, "advantage")
    sampler = from_dict(SamplerConfig, cfg.sampler, "sampler")
    optim = from_dict(OptimConfig, cfg.optim, "optim")
    trainer = from_dict(TrainerConfig, cfg.trainer, "trainer")
    run = run_config(cfg)
    if trainer.strategy == "fsdp" and run.old_policy == "copy":
        raise ConfigError("old_policy", "copy", "trainer=fsdp takes old_policy=precomputed (the old log-probs are taken at "
                          "rollout time: no second, sharded model)")
    bundle = build_policy(model_cfg, meta=meta)
    task.use_tokenizer(bundle.tokenizer)  # chat prompts use the model's chat template
    likelihood = lik_cls(lik_cfg, bundle.mask_token_id)
    likelihood.bind(bundle)  # an estimator that depends on the model checks it here (staircase: a block model)
    if bundle.noise == "uniform":  # DiffusionGemma: its own sampler (sampling/uniform_sampler.py)
        check_uniform_sampler(sampler, bundle.net)
    elif bundle.block_size > 0:
        check_block_sampler(sampler, bundle.block_size)
    else:
        check_cache_support(bundle.net, sampler.kv_cache)
    objective = obj_cls(obj_cfg, likelihood)
    objective.bind(bundle)  # an objective that depends on the model checks it here (tracerl: block or masked)
    check_noise(bundle, objective)  # no mask token: the objectives and likelihoods that read masks refuse
    if bundle.noise == "uniform" and run.rollout.tree.enabled:
        raise ConfigError("rollout.tree.branches", run.rollout.tree.branches,
                          "tree rollouts run the masked-diffusion sampler, which a uniform-noise model has not")
    objective.rollout_sampler(sampler).validate()  # an objective with its own rollout order (justgrpo) checks it here
    objective.check_advantage(adv_cfg)  # before the estimator's own checks: a wrong estimator is the first error
    advantage = adv_cls(adv_cfg)
    check_trajectory_sampler(sampler, objective)
    check_tree(run.rollout.tree, sampler, bundle.block_size, objective, run.rollout.oversample)
    check_staleness(run, trainer, objective)
    return Components(task, bundle, objective, advantage, sampler, optim, trainer, run)


def check_staleness(run: RunConfig, trainer: TrainerConfig, objective: Objective) -> None:
    """``rollout.staleness > 0`` (training/async_rollout.py) or rollout ranks: one training process, and
    with staleness the old policy a frozen copy the sampling weights are loaded into."""
    k, ranks = run.rollout.staleness, run.rollout.worker == "ranks"
    if not (k or ranks):
        return
    if trainer.strategy in ("ddp", "fsdp") or trainer.num_nodes > 1 or trainer.devices not in (1, "1", "auto"):
        key, value = ("rollout.worker", "ranks") if ranks else ("rollout.staleness", k)
        raise ConfigError(key, value, "trains in one process (a training group of one rank; the other ranks of a "
                          "torchrun launch sample with rollout.worker=ranks): use rollout.staleness=0 and "
                          f"rollout.worker=process with trainer.strategy={trainer.strategy}")
    if k + run.rollout.push_every > 1 and run.old_policy != "copy" and objective.needs_old_logp():
        raise ConfigError("old_policy", run.old_policy, "rollout.staleness > 0 takes old_policy=copy (the old policy "
                          "is the sampling weights, loaded into the copy before each batch's updates)")


def check_trajectory_sampler(sampler: SamplerConfig, objective: Objective) -> None:
    """An objective that trains on the sampler's recorded steps needs them recorded whole: no token
    editing, one sampler call for the whole rollout."""
    if not objective.needs_trajectory:
        return
    if sampler.editing_threshold is not None:
        raise ConfigError("sampler.editing_threshold", sampler.editing_threshold,
                          f"must be null with objective {objective.cfg.name}: it trains on the recorded unmasking "
                          "steps, and an edited token has no single one")
    if sampler.rollout_batch_size:
        raise ConfigError("sampler.rollout_batch_size", sampler.rollout_batch_size,
                          f"must be 0 with objective {objective.cfg.name} (its trajectory is recorded in one sampler call)")


def train(cfg: DictConfig, run_dir: str | Path, sources: Sources | None = None) -> dict[str, Any]:
    """``sources``: where each value of ``cfg`` came from (``src/train.py`` passes them), logged at start-up
    and kept in ``summary.json``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    run = run_config(cfg)  # a bad root value fails here
    # the model's initial weights (and LoRA adapters) are part of what the RL seeds share, as the warm start
    L.seed_everything(run.warmstart.seed, workers=True, verbose=False)
    first = is_first_process()
    c = build(cfg, meta=cfg.trainer.strategy == "fsdp" and not first)  # FSDP: the first process loads the weights
    if sources is not None and first:  # the run header: what this run sets, and where each setting came from
        log.info("\n".join(sources.header(cfg)))
    if c.trainer.threads:
        torch.set_num_threads(c.trainer.threads)
    group = RolloutGroup.join() if c.run.rollout.worker == "ranks" else None
    if group is not None and group.rank > 0:  # a rollout rank: it samples what the trainer (rank 0) sends
        engine = RolloutEngine(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.run.rollout, c.run.seed)
        return serve_rollout_rank(group, engine, rank_device(c.trainer.accelerator), c.run.rollout.worker_threads)
    try:
        return train_policy(cfg, c, run_dir, sources, group, t_start)
    finally:  # however the run ends, the rollout ranks return
        if group is not None:
            group.exit()


def train_policy(cfg: DictConfig, c: Components, run_dir: Path, sources: Sources | None,
                 group: RolloutGroup | None, t_start: float) -> dict[str, Any]:
    """The trainer's run (every process's under data parallelism; rank 0's with rollout ranks)."""
    first = is_first_process()
    fault = from_dict(FaultConfig, cfg.get("fault") or {}, "fault")
    check_loggers(cfg)
    datamodule = TaskDataModule(c.task, c.run.rollout.oversample, seed=c.run.seed)
    datamodule.setup()  # reads the task's files: a missing file or a bad row stops here, in one line
    test_items = datamodule.test_items()
    # ckpt_path=last | a run folder | a file; a missing or corrupt one stops here, before any work
    ckpt = resolve_checkpoint(str(cfg.ckpt_path), run_dir) if cfg.get("ckpt_path") else None
    record = RunRecord(config=OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    diagnostics = DiagnosticsCallback(c.run.diagnostics, run_dir)
    periodic = make_periodic_eval(c, datamodule, test_items)
    callbacks = [checkpoint_callback(c.trainer, run_dir, record), diagnostics, periodic] \
        + ([RLProgressBar()] if c.trainer.enable_progress_bar else []) \
        + ([FaultInjector(fault)] if fault.kind != "none" else [])
    with expected_warnings_silenced():
        loggers = make_loggers(cfg, run_dir, ResumePoint(ckpt.global_step, ckpt.run.get("wandb_id")) if ckpt else None)
        trainer = make_trainer(c, run_dir, loggers, callbacks, one_process=group is not None)
        if ckpt is not None and first:  # resuming in this folder: keep the metric rows up to the checkpoint
            continue_csv_log(loggers, ckpt.global_step)
        # the run starts: everything above only checked the config
        start_policy(cfg, c, record, ckpt, first)
        summary: dict[str, Any] = {"run_dir": str(run_dir.resolve()), "warm_start": record.warm_start,
                                   "config": record.config}
        if sources is not None:
            summary["config_sources"] = sources.record()
        module = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, c.run.seed,
                                   old_policy=c.run.old_policy, rollout=c.run.rollout, rollout_group=group)
        L.seed_everything(c.run.seed, workers=True, verbose=False)  # from here on the RL seed
        t_fit = time.perf_counter()
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt.path) if ckpt else None, weights_only=True)
        finally:  # Lightning tears the module down after a fit, not after one that raised
            module.stop_workers()
        fit_s = time.perf_counter() - t_fit
    peak = peak_host_memory_gib()
    log.info("peak host memory of process %d: %.2f GiB", trainer.global_rank, peak)
    if not trainer.is_global_zero:  # data parallel: the first process writes the summary
        return {"process": trainer.global_rank, "optimizer_steps": int(trainer.global_step), "peak_host_memory_gib": peak}
    add_evaluations(summary, periodic, run_dir)
    summary.update({"optimizer_steps": int(trainer.global_step), "rollouts": module.rollout_count,
                    "skipped_updates": module.skipped_updates, "reward_failures": c.task.reward_failures, "grad": diagnostics.tracker.summary(),
                    "num_test_items": len(test_items), "metric_definitions": c.task.metric_definitions(),
                    "validation": periodic.history,
                    "fit_s": fit_s, "wall_s": time.perf_counter() - t_start, "peak_host_memory_gib": peak,
                    "environment": environment()})
    with open(run_dir / "summary.json", "w") as f:
        json.dump(summary, f, indent=2, default=str)
    finish_loggers(loggers, summary)
    return summary


def make_periodic_eval(c: Components, datamodule: TaskDataModule, test_items: list[dict[str, Any]]) -> PeriodicEval:
    """The held-out evaluations before, during and after RL, with the papers' evaluation protocol
    whatever order and fewer-forward options the rollouts use (``eval.fast_sampler=true``: the
    rollouts' sampler as it is)."""
    ev = c.run.eval
    sampler = c.sampler if ev.fast_sampler else c.sampler.as_exact()
    return PeriodicEval(c.task, test_items, sampler, ev.batch_size, ev.every_n_steps, before=ev.before,
                        after=ev.after, periodic_items=datamodule.validation_items(),
                        progress=c.trainer.enable_progress_bar, noise_key=ev.noise_key)


def checkpoint_callback(t: TrainerConfig, run_dir: Path, record: RunRecord) -> RunCheckpoint:
    """The newest ``keep_last_k`` step checkpoints (by step) and ``last.ckpt``, each carrying ``record``."""
    keep = t.keep_last_k if t.checkpoint_every_n_steps else 0
    return RunCheckpoint(
        record, dirpath=run_dir / "checkpoints", save_last=True, save_top_k=keep, monitor="step" if keep > 0 else None,
        mode="max", every_n_train_steps=t.checkpoint_every_n_steps or None, filename="step{step:06d}",
        auto_insert_metric_name=False, enable_version_counter=False,  # resume overwrites last.ckpt
    )


def start_policy(cfg: DictConfig, c: Components, record: RunRecord, ckpt: CheckpointRef | None, first: bool) -> None:
    """The warm start (trained, or reused from ``paths.warmstart_dir``) into ``c.bundle``, then the base the frozen weights come
    from, checked against the checkpoint to resume; both go in ``record``, which every checkpoint carries."""
    if c.run.warmstart.enabled and (first or c.trainer.strategy != "fsdp"):  # FSDP: the others receive it
        record.warm_start = warm_start(c.bundle, c.task, c.sampler.gen_length, c.run.warmstart, warm_start_key(cfg),
                                       cfg.paths.warmstart_dir, c.trainer.enable_progress_bar)
    if first:
        record.base = base_identity(c.bundle, from_dict(ModelConfig, cfg.model, "model"), cfg.paths.cache_dir)
    if ckpt is not None and first:
        check_base(ckpt, record.base)


def add_evaluations(summary: dict[str, Any], periodic: PeriodicEval, run_dir: Path) -> None:
    """The held-out metrics before and after RL into ``summary``; the final generations to
    ``eval_generations.jsonl``."""
    if periodic.before is not None:
        summary["before"] = periodic.before
    if periodic.after is not None:
        summary["after"] = periodic.after
        with open(run_dir / "eval_generations.jsonl", "w") as f:
            for r in periodic.records:
                f.write(json.dumps(r) + "\n")


def peak_host_memory_gib() -> float:
    """This process's peak resident memory so far (what the OS counts, allocator caches included)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def make_trainer(c: Components, run_dir: Path, loggers: list, callbacks: list, one_process: bool = False) -> L.Trainer:
    """The Lightning trainer; a value Lightning rejects (``trainer.precision=bf17``,
    ``trainer.devices=abc``, ...) is a one-line :class:`ConfigError` (:func:`rejected_by_lightning`);
    any other error propagates with its traceback. ``one_process``: the launcher started more processes
    than train (rollout ranks), so Lightning is not to read its world from the launcher's environment."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    t = c.trainer
    strategy = make_strategy(t.strategy, t.strategy_kwargs)  # its ConfigErrors name their own keys
    try:
        return L.Trainer(
            max_steps=t.max_steps, max_epochs=-1, accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes,
            strategy=strategy,
            precision=t.precision,  # type: ignore[arg-type]  # checked by Lightning, a bad value -> ConfigError below
            logger=loggers, callbacks=callbacks, plugins=[AtomicCheckpointIO(), *([LightningEnvironment()] if one_process else [])],
            enable_progress_bar=t.enable_progress_bar,
            enable_model_summary=False, default_root_dir=run_dir, num_sanity_val_steps=0, log_every_n_steps=1, **t.extra,
        )
    except (MisconfigurationException, ValueError, TypeError) as err:
        if not rejected_by_lightning(err):
            raise
        text = " ".join(str(err).split()) or type(err).__name__
        key = next((k for k in ("devices", "precision", "strategy", "accelerator") if k in text.lower()), "extra")
        raise ConfigError(f"trainer.{key}", getattr(t, key), f"rejected by Lightning: {text[:300]}") from None


def rejected_by_lightning(err: BaseException) -> bool:
    """Whether ``err`` is Lightning refusing a trainer argument: its ``MisconfigurationException``
    (``accelerator=gpu`` without one), or the ValueError / TypeError its argument checks raise (a bad
    precision, strategy name, node or device count, an unknown keyword in ``trainer.extra``), told by
    being raised in Lightning's own code. Errors raised elsewhere (ours, torch's, a RuntimeError) are
    not config errors."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if isinstance(err, MisconfigurationException):
        return True
    if isinstance(err, ConfigError) or not isinstance(err, (ValueError, TypeError)):
        return False
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = "" if tb is None else str(tb.tb_frame.f_globals.get("__name__", ""))
    return module.split(".")[0] in ("lightning", "lightning_fabric", "pytorch_lightning")


def format_summary(summary: dict[str, Any]) -> str:
    """A short human-readable report of a finished run."""
    if "rollout_jobs" in summary:  # a rollout rank (rollout.worker=ranks)
        return (f"rollout rank {summary['process']} done: {summary['rollout_jobs']} jobs sampled in "
                f"{summary['rollout_busy_s']:.1f} s")
    if summary.get("process"):  # a data-parallel worker: the first process reports
        return f"process {summary['process']} done after {summary.get('optimizer_steps')} optimizer steps"
    lines = ["", "=" * 60, "RL run summary"]
    variant = (summary.get("config_sources") or {}).get("variant") or {}
    if variant:  # what this run sets beyond the public code's regime: the testbed's, experiment's, command line's
        lines.append(f"  variant: {variant_text(variant)}")
    for phase in ("before", "after"):
        if phase in summary:
            vals = ", ".join(f"{k}={v:.4f}" for k, v in summary[phase].items())
            lines.append(f"  held-out {phase:6s} RL: {vals}  ({summary.get('num_test_items', '?')} items)")
    shown = list(summary.get("after") or summary.get("before") or {})
    definitions = summary.get("metric_definitions") or {}
    lines += [f"    {k}: {definitions[k]}" for k in shown if k in definitions]
    g = summary.get("grad", {})
    fmt = (lambda x: f"{x:.3f}" if isinstance(x, float) and math.isfinite(x) else str(x))
    lines.append(f"  optimizer steps: {summary.get('optimizer_steps')}  rollouts: {summary.get('rollouts')}"
                 f"  skipped updates: {summary.get('skipped_updates')}")
    lines.append(f"  grad norm (pre-clip): mean={fmt(g.get('grad_norm_mean'))} max={fmt(g.get('grad_norm_max'))}"
                 f" spikes={g.get('grad_spikes')}")
    lines.append(f"  wall time: {summary.get('wall_s', 0):.1f} s")
    lines.append(f"  run folder: {summary.get('run_dir')}")
    lines.append("=" * 60)
    return "\n".join(lines)


__all__ = ["train", "build", "format_summary", "warm_start_key", "Components", "TrainerConfig", "EvalConfig", "RunConfig"]
