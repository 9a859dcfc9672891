"""The papers' evaluation protocol, and re-scoring of saved generations (``src/eval.py``).

Protocol (LLaDA / d1): zero-shot, greedy (temperature 0), ``steps = gen_length / 2``
(``eval.steps_per_token``), blocks of ``eval.block_length = 32`` tokens (the whole length when
shorter), every length of ``eval.gen_lengths`` in one call, on the task's test set (every item of
``task.data_path`` or of the hub's test split unless ``task.num_test`` caps them; 256 generated
Sudoku / Countdown items), in batches of ``eval.batch_size`` with a progress bar. ``eval.gen_lengths: null`` means the papers' lengths
``[128, 256, 512]`` for chat prompts and ``[sampler.gen_length]`` for compact prompts (the embedded
model, whose answers are a few characters; pass e.g. ``eval.gen_lengths=[16,32]`` to sweep).

Scoring (``eval.protocol``): ``ours`` (default) reads what the prompt asks for with the task's own
parsers; ``d1`` scores exactly as d1's ``eval/parse_and_get_acc.py`` did for the papers' rows
(``rewards/d1/scoring.py``: GSM8K, MATH500, Countdown, Sudoku; quirks included, Sudoku's cell accuracy
pooled over cells). ``mode=score generations=`` also reads d1's released generation files (a file or
a folder of ``{task}_{model}_{length}_{steps}_{shard}_generations.json``), so
``python src/eval.py mode=score task=gsm8k eval.protocol=d1 generations=<d1_llada_eval folder>``
gives the papers' LLaDA row (tests/fixtures/d1_llada_eval/ packs those files); without ``eval.protocol=d1`` the same files get our protocol.

Policies (``policy=``): ``checkpoint`` (the default: the model of ``ckpt_path=<run folder | .ckpt |
last>``, rebuilt from the run config the checkpoint carries, ``training/restore.py``; loaded with
``weights_only=True``, so nothing in a checkpoint is unpickled as code), ``init`` (the configured
model, untrained), ``warmstart`` (the configured model after the warm start, reused as in training)
or ``reference``, which answers every item with its gold answer in the task's format
(``task.target(item)``) and so checks prompts, parsing, rewards and metrics end to end without a
model: it must score 100%. Without ``ckpt_path`` an evaluation of a model must name ``init`` or
``warmstart``: an untrained model scoring 0 is never what a forgotten ``ckpt_path`` should give. ``mode=score generations=file.jsonl`` re-scores saved generations with the
current task code and config (a fixed parser, another reward), no model needed.

Writes to the run folder ``generations.jsonl`` (one record per length and item: ``gen_length``,
``index``, ``prompt``, ``prefill``, ``completion``, ``answer`` (extracted), ``gold``, ``reward``,
``correct`` where the task has one, the task's own fields (the code tasks' ``sandbox`` verdict:
``Task.details``), and the ``item`` for re-scoring), ``eval_summary.json`` (metrics
per length under ``by_length``; the first length's also at top level) and ``eval_summary.md`` (the
same as a table). A scored response is ``prefill + completion``: the ``<reasoning>`` that ends a chat
evaluation prompt is part of the answer the format rewards check.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from diffusion_rl.app.train import EvalConfig, RunConfig, build_task, run_config, warm_start_key
from diffusion_rl.core.config import from_dict
from diffusion_rl.core.environment import environment
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.policy import ModelConfig, PolicyBundle
from diffusion_rl.rewards.d1.scoring import D1_PROTOCOLS, d1_score
from diffusion_rl.rewards.prompted import until_end_token
from diffusion_rl.sampling import SamplerConfig
from diffusion_rl.tasks import Task
from diffusion_rl.training.evaluation import generate_texts
from diffusion_rl.training.restore import (
    command_line_overrides,
    load_run_checkpoint,
    restore_policy,
)
from diffusion_rl.training.warmstart import warm_start

log = logging.getLogger(__name__)

PAPER_GEN_LENGTHS = [128, 256, 512]
MODES = ("generate", "score")
POLICIES = ("checkpoint", "init", "warmstart", "reference")
PROTOCOLS = ("ours", "d1")
D1_PREFILL = "<reasoning>"  # d1's evaluation prompts end with it (add_reasoning=True)


@dataclass
class EvalProtocolConfig(EvalConfig):
    """``eval:`` of conf/eval.yaml; ``before`` / ``after`` are the training run's keys."""

    gen_lengths: list[int] | None = None  # null: [128, 256, 512] (chat prompts) / [sampler.gen_length]
    block_length: int = 32
    steps_per_token: float = 0.5  # steps = gen_length * 0.5, as the papers
    device: str = "auto"  # auto | cpu | cuda | cuda:1 ...
    progress: bool = True
    protocol: str = "ours"  # ours (read what the prompt asks for) | d1 (d1's parsers, quirks included)

    def validate(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError("eval.protocol", self.protocol, f"allowed: {', '.join(PROTOCOLS)}")
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
    """Greedy, low-confidence remasking (the papers' order, whatever order the rollouts use: Sudoku's
    unmask at random; the even schedule without EOS scaling, whatever CJ-GRPO's decoders the rollouts
    ran), blocks of ``min(block_length, gen_length)``, ``steps = gen_length * steps_per_token``
    rounded to a whole number of steps per block."""
    block = min(ev.block_length, gen_length)
    if gen_length % block:
        raise ConfigError("eval.gen_lengths", gen_length, f"must be a multiple of eval.block_length={block}")
    blocks = gen_length // block
    per_block = max(1, round(gen_length * ev.steps_per_token / blocks))
    sampler = replace(base, gen_length=gen_length, block_length=block, steps=blocks * per_block, temperature=0.0,
                      remasking="low_confidence", schedule="even", eos_gamma_min=1.0, eos_gamma_max=1.0)
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
def check_protocol(protocol: str, task: Task) -> None:
    if protocol == "d1" and task.cfg.name not in D1_PROTOCOLS:
        raise ConfigError("eval.protocol", protocol,
                          f"d1's parsers exist for {', '.join(D1_PROTOCOLS)}, not task={task.cfg.name}")
    if protocol == "d1" and getattr(task.cfg, "pin_givens", False):
        raise ConfigError("task.pin_givens", True, "eval.protocol=d1 scores the grid the model writes, givens included, "
                          "as d1 does: set task.pin_givens=false")


def score_records(task: Task, records: list[dict[str, Any]], protocol: str = "ours") -> dict[int, dict[str, float]]:
    """Fill ``answer``, ``gold``, ``reward`` (and ``correct``) of each record in place; metrics per length.

    ``protocol="d1"`` takes ``answer``, ``correct`` and the metric from d1's parsers (Sudoku records
    also get ``cells``: ``[right, empty]``) on the verbatim completion; ours reads the response
    ``prefill + completion`` up to LLaDA's first end token (a no-op on our own decoded text).
    ``reward`` is the task's configured reward of that response either way.
    """
    d1 = protocol == "d1"
    check_protocol(protocol, task)
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[int(r["gen_length"])].append(r)
    by_length: dict[int, dict[str, float]] = {}
    correctness = getattr(task, "correctness", None)
    for length in sorted(groups):
        group = groups[length]
        items = [r["item"] for r in group]
        responses = [r.get("prefill", "") + (r["completion"] if d1 else until_end_token(r["completion"]))
                     for r in group]
        rewards = task.rewards(responses, items).tolist()
        for r, rew, extra in zip(group, rewards, task.details(responses, items)):
            r.update(gold=task.gold(r["item"]), reward=rew, **extra)  # extra: the code tasks' sandbox verdict
        if d1:  # d1 parses the generated text alone, without the prefilled "<reasoning>"
            scored, metrics = d1_score(task.cfg.name, [r["completion"] for r in group], items)
            for r, (answer, points, out_of) in zip(group, scored):
                r.update(answer=answer, correct=points == out_of)
                if task.cfg.name == "sudoku":
                    r["cells"] = [int(points), out_of]
        else:
            right = correctness(responses, items) if correctness is not None else None
            for k, (r, resp) in enumerate(zip(group, responses)):
                r["answer"] = task.parse(resp)
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
            canvas = task.canvas(items, bundle.tokenizer, sampler.gen_length, bundle.mask_token_id)
            completions = generate_texts(bundle, prompts, sampler, ev.batch_size, desc=desc, canvas=canvas)
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
    definitions = task.metric_definitions()
    if info.get("protocol") == "d1":  # the metric is d1's, not our task's
        definitions[D1_PROTOCOLS[task.cfg.name].metric] = ("as d1's eval/parse_and_get_acc.py computes it (its parsers, "
                                                           "quirks included; rewards/d1/scoring.py): points over the total")
    return {"task": task.cfg.name, **info, "gen_lengths": list(by_length),
            "by_length": {str(k): v for k, v in by_length.items()}, **first, "metric_definitions": definitions,
            "environment": environment()}


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
    check_protocol(ev.protocol, task)
    device = _device(ev.device)
    items = task.test_items()  # and a missing or malformed test file
    bundle = None
    if policy != "reference":
        torch.manual_seed(run.warmstart.seed)  # the initial weights a training run with this warm start had
        bundle = build_policy(from_dict(ModelConfig, cfg.model, "model"))
        if ckpt is not None:
            restore_policy(bundle, ckpt[1], ckpt[0], str(run.ckpt_path), from_dict(ModelConfig, cfg.model, "model"),
                           cfg.paths.cache_dir)
        elif policy == "warmstart":
            warm_start(bundle, task, sampler.gen_length, run.warmstart, warm_start_key(cfg), cfg.paths.warmstart_dir,
                       ev.progress)
        bundle.net.to(device)
        task.use_tokenizer(bundle.tokenizer)
    records = generate_records(task, items, lengths, policy, bundle, sampler, ev)
    by_length = score_records(task, records, ev.protocol)
    summary = _summary(task, by_length, policy=policy, protocol=ev.protocol, ckpt_path=str(ckpt[0]) if ckpt else None,
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


def _load_json(path: Path, key: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(key, str(path), f"unreadable JSON ({err})") from err


def read_d1_generations(path: str | Path, task_name: str,
                        dataset: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Records from d1's released generation files: a ``*_generations.json`` file, or a folder whose
    files for this task (``{task}_*_generations.json``) are read in name order.

    Each file holds ``gen_length`` and ``generations``: a list of ``question``, ``generations`` (the
    text generated after the prompt's ``<reasoning>``) and ``ground_truth`` (d1's gold). The
    completion is kept verbatim, special tokens included (d1's Sudoku parser reads ``<|eot_id|>``);
    the item is our task's, built from d1's gold, so both protocols can score it. d1 stores GSM8K's
    gold as the float it read, None for a negative answer: given the task's own test items
    (``dataset``), GSM8K and MATH500 records take the item whose question is d1's (d1's scores are
    unchanged: its gold comes from the same solution text).
    """
    protocol = D1_PROTOCOLS.get(task_name)
    if protocol is None:
        raise ConfigError("task", task_name, f"d1 released generations for {', '.join(D1_PROTOCOLS)} only")
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(p.glob(f"{protocol.file_prefix}_*_generations.json"))
        if not files:
            raise ConfigError("generations", str(path), f"no {protocol.file_prefix}_*_generations.json in this folder")
    elif p.is_file():
        files = [p]
    else:
        raise ConfigError("generations", str(path), "no such file or folder")
    key = protocol.question_key
    known = {it[key]: it for it in dataset or [] if key is not None and key in it}
    records: list[dict[str, Any]] = []
    count: dict[int, int] = defaultdict(int)
    lost_golds = 0
    for file in files:
        blob = _load_json(file, "generations")
        if not isinstance(blob, dict) or not isinstance(blob.get("generations"), list) or "gen_length" not in blob:
            raise ConfigError("generations", str(file), "not d1's format (an object with gen_length and generations)")
        length = int(blob["gen_length"])
        for k, g in enumerate(blob["generations"]):
            if not isinstance(g, dict) or not {"question", "generations", "ground_truth"} <= set(g):
                raise ConfigError("generations", str(file), f"entry {k} lacks question / generations / ground_truth")
            lost_golds += g["ground_truth"] is None and g["question"] not in known
            try:
                item = known.get(g["question"]) or protocol.item(g["question"], g["ground_truth"])
            except (ValueError, TypeError) as err:
                raise ConfigError("generations", str(file), f"entry {k} is not a {task_name} item ({err})") from err
            records.append({"gen_length": length, "index": count[length], "question": g["question"],
                            "prefill": D1_PREFILL, "completion": str(g["generations"]), "item": item,
                            "source": f"{file.name}#{k}"})
            count[length] += 1
    if not records:
        raise ConfigError("generations", str(path), "holds no generations")
    if lost_golds:
        log.warning("%d of %d generations have no gold in d1's file (d1 could not read a negative answer): both "
                    "protocols score them wrong; task.data_path=<the test set> gives ours the real gold",
                    lost_golds, len(records))
    return records


def is_d1_format(path: str | Path) -> bool:
    """d1's generations are JSON objects (``.json``, or a folder of them); ours are ``.jsonl``."""
    p = Path(path).expanduser()
    return p.is_dir() or p.suffix == ".json"


def rescore_generations(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """``mode=score``: re-score ``generations=`` (our ``generations.jsonl``, or d1's released
    generations: a ``.json`` file or a folder) with the current task and ``eval.protocol``; no model."""
    if not cfg.get("generations"):
        raise ConfigError("generations", None, "mode=score needs generations=path/to/generations.jsonl "
                          "(or d1's *_generations.json file or folder)")
    run = run_config(cfg, EvalRunConfig)
    assert isinstance(run, EvalRunConfig)
    task_cfg = cfg.task
    d1_files = is_d1_format(cfg.generations)
    if d1_files and task_cfg.get("prompt_style") == "compact":
        # d1's completions answer its chat prompts: score them as chat responses, not bare answers
        task_cfg = OmegaConf.merge(task_cfg, {"prompt_style": "chat"})
    task = build_task(task_cfg)
    check_protocol(run.eval.protocol, task)
    if d1_files:  # with task.data_path, the task's own items give the golds d1 could not store
        dataset = task.test_items() if task_cfg.get("data_path") else None
        records = read_d1_generations(cfg.generations, task.cfg.name, dataset)
    else:
        records = read_generations(cfg.generations)
    by_length = score_records(task, records, run.eval.protocol)
    summary = _summary(task, by_length, policy="rescored", protocol=run.eval.protocol, generations=str(cfg.generations),
                       num_items=max(v["num_items"] for v in by_length.values()))
    write_outputs(Path(run_dir), records, summary)
    return summary


def run_eval(cfg: DictConfig, run_dir: str | Path) -> dict[str, Any]:
    """``mode=generate`` (default) or ``mode=score``."""
    run = run_config(cfg, EvalRunConfig)
    assert isinstance(run, EvalRunConfig)
    return rescore_generations(cfg, run_dir) if run.mode == "score" else evaluate_checkpoint(cfg, run_dir)
