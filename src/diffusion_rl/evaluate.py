"""The papers' evaluation protocol, and re-scoring of saved generations (``src/eval.py``).

Protocol (LLaDA / d1): zero-shot, greedy (temperature 0), ``steps = gen_length / 2``
(``eval.steps_per_token``), blocks of ``eval.block_length = 32`` tokens (the whole length when
shorter), every length of ``eval.gen_lengths`` in one call, on the task's test set (every item of
``task.data_path`` or of the hub's test split unless ``task.num_test`` caps them; 256 generated
Sudoku / Countdown items), in batches of ``eval.batch_size`` with a progress bar. ``eval.gen_lengths: null`` means the papers' lengths
``[128, 256, 512]`` for chat prompts and ``[sampler.gen_length]`` for compact prompts (the embedded
model, whose answers are a few characters; pass e.g. ``eval.gen_lengths=[16,32]`` to sweep).

Policies (``policy=``): ``checkpoint`` (the default: the model of ``ckpt_path=<run folder | .ckpt |
last>``, rebuilt from the run config the checkpoint carries, ``training/restore.py``; loaded with
``weights_only=True``, so nothing in a checkpoint is unpickled as code), ``init`` (the configured
model, untrained), ``warmstart`` (the configured model after the warm start, cached as in training)
or ``reference``, which answers every item with its gold answer in the task's format
(``task.target(item)``) and so checks prompts, parsing, rewards and metrics end to end without a
model: it must score 100%. Without ``ckpt_path`` an evaluation of a model must name ``init`` or
``warmstart``: an untrained model scoring 0 is never what a forgotten ``ckpt_path`` should give. ``mode=score generations=file.jsonl`` re-scores saved generations with the
current task code and config (a fixed parser, another reward), no model needed.

Writes to the run folder ``generations.jsonl`` (one record per length and item: ``gen_length``,
``index``, ``prompt``, ``prefill``, ``completion``, ``answer`` (extracted), ``gold``, ``reward``,
``correct`` where the task has one, and the ``item`` for re-scoring), ``eval_summary.json`` (metrics
per length under ``by_length``; the first length's also at top level) and ``eval_summary.md`` (the
same as a table). A scored response is ``prefill + completion``: the ``<reasoning>`` that ends a chat
evaluation prompt is part of the answer the format rewards check.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from diffusion_rl.config import from_dict
from diffusion_rl.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, PolicyBundle
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.tasks import Task
from diffusion_rl.train import EvalConfig, RunConfig, build_task, run_config, warm_start_key
from diffusion_rl.training.evaluation import generate_texts
from diffusion_rl.training.restore import (
    command_line_overrides,
    load_run_checkpoint,
    restore_policy,
)
from diffusion_rl.training.warmstart import warm_start

PAPER_GEN_LENGTHS = [128, 256, 512]
MODES = ("generate", "score")
POLICIES = ("checkpoint", "init", "warmstart", "reference")


@dataclass
class EvalProtocolConfig(EvalConfig):
    """``eval:`` of conf/eval.yaml; ``before`` / ``after`` are the training run's keys."""

    gen_lengths: list[int] | None = None  # null: [128, 256, 512] (chat prompts) / [sampler.gen_length]
    block_length: int = 32
    steps_per_token: float = 0.5  # steps = gen_length * 0.5, as the papers
    device: str = "auto"  # auto | cpu | cuda | cuda:1 ...
    progress: bool = True

    def validate(self) -> None:
        if self.gen_lengths is not None and (not self.gen_lengths or min(self.gen_lengths) < 1):
            raise ConfigError("eval.gen_lengths", self.gen_lengths, "must be a non-empty list of lengths >= 1, or null")
        if self.block_length < 1:
            raise ConfigError("eval.block_length", self.block_length, "must be >= 1")
        if not 0 < self.steps_per_token <= 1:
            raise ConfigError("eval.steps_per_token", self.steps_per_token, "must be in (0, 1]")
        if self.batch_size < 1:
            raise ConfigError("eval.batch_size", self.batch_size, "must be >= 1")


@dataclass
class EvalRunConfig(RunConfig):
    """The root keys of conf/eval.yaml: the training run's, the protocol, and what to evaluate."""

    eval: EvalProtocolConfig = field(default_factory=EvalProtocolConfig)
    mode: str = "generate"  # generate | score (re-score `generations` without a model)
    # checkpoint (ckpt_path) | init (untrained) | warmstart | reference (gold answers: must score 100%)
    policy: str = "checkpoint"
    generations: str | None = None  # mode=score: a generations.jsonl written by src/eval.py

    def validate(self) -> None:
        super().validate()
        if self.mode not in MODES:
            raise ConfigError("mode", self.mode, f"allowed: {', '.join(MODES)}")
        if self.policy not in POLICIES:
            raise ConfigError("policy", self.policy, f"allowed: {', '.join(POLICIES)}")
        if self.mode == "score":
            return
        if self.policy == "checkpoint" and not self.ckpt_path:
            raise ConfigError("ckpt_path", None, "evaluate which model? give ckpt_path=<run folder | .ckpt | last>, "
                              "or policy=init (untrained), policy=warmstart or policy=reference (gold answers)")
        if self.policy != "checkpoint" and self.ckpt_path:
            raise ConfigError("ckpt_path", self.ckpt_path, f"policy={self.policy} evaluates no checkpoint: "
                              "drop ckpt_path, or drop policy (policy=checkpoint)")


def gen_lengths(ev: EvalProtocolConfig, task: Task, sampler: SamplerConfig) -> list[int]:
    if ev.gen_lengths is not None:
        return list(ev.gen_lengths)
    compact = getattr(task.cfg, "prompt_style", "compact") == "compact"
    return [sampler.gen_length] if compact else list(PAPER_GEN_LENGTHS)


def protocol_sampler(base: SamplerConfig, gen_length: int, ev: EvalProtocolConfig) -> SamplerConfig:
    """Greedy, blocks of ``min(block_length, gen_length)``, ``steps = gen_length * steps_per_token``
    rounded to a whole number of steps per block."""
    block = min(ev.block_length, gen_length)
    if gen_length % block:
        raise ConfigError("eval.gen_lengths", gen_length, f"must be a multiple of eval.block_length={block}")
    blocks = gen_length // block
    per_block = max(1, round(gen_length * ev.steps_per_token / blocks))
    sampler = replace(base, gen_length=gen_length, block_length=block, steps=blocks * per_block, temperature=0.0)
    sampler.validate("eval")
    return sampler


# ---- policies -----------------------------------------------------------------------------------
def reference_completions(task: Task, items: list[dict[str, Any]]) -> list[str]:
    """The gold answer of each item in the task's format, less the evaluation prefill."""
    prefill = task.eval_prefill
    out = []
    for it in items:
        target = task.target(it)
        out.append(target[len(prefill):] if prefill and target.startswith(prefill) else target)
    return out


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError as err:
        raise ConfigError("eval.device", name, "allowed: auto, cpu, cuda, cuda:N") from err


# ---- scoring ------------------------------------------------------------------------------------
def score_records(task: Task, records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Fill ``answer``, ``gold``, ``reward`` (and ``correct``) of each record in place; metrics per length."""
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[int(r["gen_length"])].append(r)
    by_length: dict[int, dict[str, float]] = {}
    correctness = getattr(task, "correctness", None)
    for length in sorted(groups):
        group = groups[length]
        items = [r["item"] for r in group]
        responses = [r.get("prefill", "") + r["completion"] for r in group]
        rewards = task.rewards(responses, items).tolist()
        right = correctness(responses, items) if correctness is not None else None
        for k, (r, resp, rew) in enumerate(zip(group, responses, rewards)):
            r.update(answer=task.parse(resp), gold=task.gold(r["item"]), reward=rew)
            if right is not None:
                r["correct"] = bool(right[k])
        metrics = task.metrics(responses, items)
        by_length[length] = {**metrics, "reward": sum(rewards) / max(len(rewards), 1), "num_items": len(group)}
    return by_length


def generate_records(task: Task, items: list[dict[str, Any]], lengths: list[int], policy: str,
                     bundle: PolicyBundle | None, base_sampler: SamplerConfig,
                     ev: EvalProtocolConfig) -> list[dict[str, Any]]:
    prompts = [task.eval_prompt(it) for it in items]
    prefill = task.eval_prefill
    records = []
    for length in lengths:
        sampler = protocol_sampler(base_sampler, length, ev)
        if policy == "reference":
            completions = reference_completions(task, items)
        else:
            assert bundle is not None
            if bundle.block_size > 0:
                from diffusion_rl.sampling.block import check_block_sampler

                check_block_sampler(sampler, bundle.block_size)
            desc = f"{task.cfg.name} gen_length={length}" if ev.progress else None
            completions = generate_texts(bundle, prompts, sampler, ev.batch_size, desc=desc)
        records += [{"gen_length": length, "index": i, "prompt": p, "prefill": prefill, "completion": c, "item": it}
                    for i, (p, c, it) in enumerate(zip(prompts, completions, items))]
    return records


# ---- outputs ------------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) and math.isfinite(v) else str(v)


def summary_markdown(task_name: str, by_length: dict[int, dict[str, float]], scored: str | None = None,
                     definitions: dict[str, str] | None = None) -> str:
    """The metrics table, what was scored, and one line defining each metric."""
    keys = list(next(iter(by_length.values())).keys()) if by_length else []
    lines = [f"| {task_name} gen_length | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for length, m in by_length.items():
        lines.append(f"| {length} | " + " | ".join(_fmt(m[k]) for k in keys) + " |")
    if scored:
        lines += ["", f"Scored {scored}."]
    if definitions:
        lines += [""] + [f"- `{k}`: {definitions[k]}" for k in keys if k in definitions]
    return "\n".join(lines) + "\n"


def write_outputs(run_dir: Path, records: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "generations.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(run_dir / "eval_summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    by_length = {int(k): v for k, v in summary["by_length"].items()}
    (run_dir / "eval_summary.md").write_text(summary_markdown(summary["task"], by_length, summary.get("scored"),
                                                              summary.get("metric_definitions")))


def _summary(task: Task, by_length: dict[int, dict[str, float]], **info: Any) -> dict[str, Any]:
    first = next(iter(by_length.values()), {})
    return {"task": task.cfg.name, **info, "gen_lengths": list(by_length),
            "by_length": {str(k): v for k, v in by_length.items()}, **first,
            "metric_definitions": task.metric_definitions()}


def items_scored(task: Task, n: int) -> str:
    """Which test items an evaluation scored, in words: all of a file, or how many of how many."""
    cfg = task.cfg
    if not cfg.data_path:
        return f"{n} items of the task's own test set (task.num_test={cfg.num_test if cfg.num_test is not None else 'null'})"
    if cfg.num_test is None:
        return f"all {n} items of {cfg.data_path}"
    total = len(type(task)(replace(cfg, num_test=None)).test_items())
    return f"{n} of the {total} items of {cfg.data_path} (task.num_test={cfg.num_test}; task.num_test=null scores all)"


# ---- entry points -------------------------------------------------------------------------------
def evaluate_checkpoint(cfg: DictConfig, run_dir: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Generate with ``policy`` at every protocol length, score, and write the outputs.

    ``overrides``: what the user set explicitly (default: Hydra's command line); with a checkpoint
    they go on top of the run config it carries (``training/restore.py``).
    """
    run_dir = Path(run_dir)
    run = run_config(cfg, EvalRunConfig)
    assert isinstance(run, EvalRunConfig)
    ckpt = None
    if run.policy == "checkpoint":
        assert run.ckpt_path is not None  # validated
        cfg, path, blob = load_run_checkpoint(cfg, run.ckpt_path, command_line_overrides() if overrides is None else overrides)
        ckpt = (path, blob)
        run = run_config(cfg, EvalRunConfig)  # eval.batch_size follows the run's task
        assert isinstance(run, EvalRunConfig)
    policy, ev = run.policy, run.eval
    task = build_task(cfg.task)
    sampler = from_dict(SamplerConfig, cfg.sampler, "sampler")
    lengths = gen_lengths(ev, task, sampler)
    for length in lengths:
        protocol_sampler(sampler, length, ev)  # a bad length fails before any model is built
    device = _device(ev.device)
    items = task.test_items()  # and a missing or malformed test file
    bundle = None
    if policy != "reference":
        bundle = build_policy(from_dict(ModelConfig, cfg.model, "model"))
        if ckpt is not None:
            restore_policy(bundle, ckpt[1], ckpt[0], str(run.ckpt_path))
        elif policy == "warmstart":
            warm_start(bundle, task, sampler.gen_length, run.warmstart, warm_start_key(cfg), cfg.paths.cache_dir, ev.progress)
        bundle.net.to(device)
        task.use_tokenizer(bundle.tokenizer)
    records = generate_records(task, items, lengths, policy, bundle, sampler, ev)
    by_length = score_records(task, records)
    summary = _summary(task, by_length, policy=policy, ckpt_path=str(ckpt[0]) if ckpt else None,
                       num_items=len(items), scored=items_scored(task, len(items)))
    write_outputs(run_dir, records, summary)
    return summary


def read_generations(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError("generations", str(path), "no such file")
    records = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError("generations", str(path), f"line {n} is not JSON ({err.msg})") from err
            if not isinstance(r, dict) or not {"gen_length", "completion", "item"} <= set(r):
                raise ConfigError("generations", str(path), f"line {n} lacks gen_length / completion / item "
                                  "(a file written by src/eval.py)")
            records.append(r)
    if not records:
        raise ConfigError("generations", str(path), "holds no generations")
    return records


def rescore_generations(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """``mode=score``: re-score ``generations=file.jsonl`` with the current task; no model."""
    if not cfg.get("generations"):
        raise ConfigError("generations", None, "mode=score needs generations=path/to/generations.jsonl")
    task = build_task(cfg.task)
    records = read_generations(cfg.generations)
    by_length = score_records(task, records)
    summary = _summary(task, by_length, policy="rescored", generations=str(cfg.generations),
                       num_items=max(v["num_items"] for v in by_length.values()))
    write_outputs(Path(run_dir), records, summary)
    return summary


def run_eval(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """``mode=generate`` (default) or ``mode=score``."""
    run = run_config(cfg, EvalRunConfig)
    assert isinstance(run, EvalRunConfig)
    return rescore_generations(cfg, run_dir) if run.mode == "score" else evaluate_checkpoint(cfg, run_dir)
