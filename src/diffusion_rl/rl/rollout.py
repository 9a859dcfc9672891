"""Rollouts: prompts in, a typed :class:`~diffusion_rl.rl.batch.Rollout` out (no Lightning).

One call of :class:`RolloutEngine` does, for a batch of task items:

1. expand each item to ``G`` rows, encode the prompts, keep this process's share of the rows
   (``core/distributed.py``);
2. sample completions with the old policy (the sampler of docs/methods.md §2 with the options
   of §10, or the block sampler for a block model), ``sampler.rollout_batch_size`` rows per call,
   each row's Gumbel noise from its own generator keyed by ``(seed, rollout id, global row)``
   (``sampling/noise.py``: the call size and the number of processes change no sample); the
   trajectory is recorded when the objective trains on denoising steps. The sampler's own
   log-probability of every committed token rides on the rollout (``Rollout.sampler_logp``:
   behaviour correction and ``rollout/mismatch_log_ratio``, ``rl/objectives/behaviour.py``);
3. select the steps the objective trains on (EGSPO; MDPO: every step) and, when the advantage
   estimator needs values, rebuild the one-step completions at those steps (EGSPO-SA: the greedy
   ones; MDPO: the sampler's own predictions);
4. decode every completion once and score all of them in **one** pass of the task's reward functions;
5. gather the rewards of all processes and compute the advantages once, with the configured
   estimator (``rl/advantages.py``), keeping this process's rows.

The rollout's metrics (``train/reward``, ``train/entropy``, ``time/rollout_s``, ...
docs/methods.md §6) ride on the returned object and are logged with its first inner update, with the
sampler's cost:

- ``rollout/forwards_per_sample``: model calls each sample went through (classifier-free guidance
  counts two); ``rollout/steps_per_sample``: denoising steps taken (no longer fixed with
  ``sampler.decode=threshold|factor``);
- ``rollout/forward_tokens_per_sample``: query positions each sample sent through the model, the
  measure of forward FLOPs (a cached step runs a block, not the whole sequence);
- ``rollout/tokens_per_forward``: completion tokens per forward pass (``gen_length / forwards``);
- ``rollout/filled_frac``: share of completion tokens set to EOS without a forward (``stop_after_eos``);
- ``rollout/edited_per_sample``: tokens replaced by token editing (``sampler.editing_threshold``);
- ``reward/*``: the task's metrics of its rewards on every row drawn (``Task.reward_metrics``: the code
  tasks' ``reward/timeout_frac``, programs stopped by their time limit).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from diffusion_rl.core.distributed import Shard
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.core.seeding import mix_seed
from diffusion_rl.models.policy import PolicyBundle, decode_completions, encode_prompts, logits_fn
from diffusion_rl.rl.advantages import AdvantageEstimator
from diffusion_rl.rl.batch import Rollout
from diffusion_rl.rl.objectives.base import Objective, RolloutTools
from diffusion_rl.rl.tree import Tree, TreeConfig, grow_trees
from diffusion_rl.sampling import RowNoise, SamplerConfig, sample
from diffusion_rl.sampling.sampler import SampleOutput, completion_mask
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from diffusion_rl.sampling.uniform_trajectory import Trajectory, UniformTrajectory
from diffusion_rl.tasks.base import Task

_GUMBEL_SALT = 0xA11
_RESAMPLE_SALT = 0xA12  # the noise of an objective's resampled rows (RolloutTools.sample)
ROLLOUT_WORKERS = ("process", "inline", "ranks")  # rollout.worker


@dataclass
class RolloutConfig:
    """``rollout:`` root keys."""

    # DAPO's dynamic sampling: draw oversample x task.prompts_per_batch prompts, keep
    # task.prompts_per_batch groups, those whose rewards differ first (a group whose G rewards agree
    # has zero advantage and adds nothing but dilution); 1 = off
    oversample: int = 1
    # reward of a completion with no EOS (it ran out of canvas: truncated), in place of the task's;
    # null keeps the task's. TraceRL counts truncated responses as wrong (reward/rl_reward.py): 0.0
    # there. Off by default: a Sudoku answer fills the whole 16-token completion, with no room for EOS
    truncated_reward: float | None = None
    # tree rollouts (rl/tree.py): a prompt's group is the leaves of a tree of partial states, and
    # task.group_size is not used; branches: [] (default) samples the group independently
    tree: TreeConfig = field(default_factory=TreeConfig)
    # bounded staleness (training/async_rollout.py): batch r is sampled with the weights of RL step
    # r - k while the trainer trains on batch r - k; 0 = the synchronous loop
    staleness: int = 0
    # where the sampler runs when staleness > 0: process (its own process, overlapping the trainer) |
    # ranks (ranks 1..R of a torchrun / srun launch of 1 + R processes, rank 0 training; at any staleness,
    # 0 included) | inline (in the trainer's process, one after the other: the same rollouts, for checks)
    worker: str = "process"
    worker_threads: int = 1  # torch intra-op threads of the worker process or rank; 0 = torch's default
    # the worker gets new weights every n RL steps (the staleness then reaches staleness + n - 1): for a
    # network whose push costs more than a little staleness (rollout ranks on other nodes); 1 = every step
    push_every: int = 1

    def validate(self) -> None:
        if self.oversample < 1:
            raise ConfigError("rollout.oversample", self.oversample, "must be >= 1 (1 = off)")
        if self.staleness < 0:
            raise ConfigError("rollout.staleness", self.staleness, "must be >= 0 (0 = synchronous)")
        if self.worker not in ROLLOUT_WORKERS:
            raise ConfigError("rollout.worker", self.worker, f"allowed: {', '.join(ROLLOUT_WORKERS)}")
        if self.push_every < 1:
            raise ConfigError("rollout.push_every", self.push_every, "must be >= 1 (1 = every RL step)")
        if self.push_every > 1 and not (self.staleness or self.worker == "ranks"):
            raise ConfigError("rollout.push_every", self.push_every, "takes rollout.staleness >= 1 (or rollout "
                              "ranks): the synchronous loop samples with the weights it trains")
        if self.worker_threads < 0:
            raise ConfigError("rollout.worker_threads", self.worker_threads, "must be >= 0 (0 = torch's default)")
        self.tree.validate()


def check_tree(tree: TreeConfig, sampler: SamplerConfig, block_size: int, objective: Objective,
               oversample: int = 1) -> None:
    """Fail in one line when the rollout mode does not fit the sampler, model or objective."""
    if objective.needs_tree and not tree.enabled:
        raise ConfigError("rollout.tree.branches", tree.branches,
                          f"objective {objective.cfg.name} trains on tree rollouts: give the children per branch "
                          "point, e.g. [4, 4]")
    if not tree.enabled:
        return
    tree.validate(sampler)
    if block_size > 0:
        raise ConfigError("rollout.tree.branches", tree.branches,
                          "tree rollouts run the masked-diffusion sampler: a block model (model.block_size > 0) has none")
    if objective.needs_trajectory:
        raise ConfigError("rollout.tree.branches", tree.branches,
                          f"objective {objective.cfg.name} trains on a recorded trajectory, which a tree does not record")
    if oversample > 1:
        raise ConfigError("rollout.oversample", oversample, "must be 1 with rollout.tree (a tree is kept whole)")


@dataclass
class Draw:
    """The sampling stage's output: this process's rows as the old policy drew them, before any
    reward (the rollout's per-row tensors, and the sampler's totals the metrics read)."""

    prompt_ids: torch.Tensor  # (n, P) left-padded
    prompt_mask: torch.Tensor  # (n, P)
    items: list[dict[str, Any]]  # the task item of each row
    completion: torch.Tensor  # (n, L)
    sampler_logp: torch.Tensor  # (n, L) the sampler's log-prob of each committed token
    entropy: torch.Tensor  # (2,) float64 [entropy sum, committed tokens] over this process's rows
    cost: torch.Tensor  # (5,) float64 [forwards, forward tokens, steps, filled, edited] summed over the rows
    shard: Shard
    trajectory: Trajectory | None
    pinned: torch.Tensor | None  # (n, L) bool the task's known tokens
    tree: Tree | None


@dataclass
class Advantages:
    """The advantage stage's output, computed from the rows kept."""

    rewards: torch.Tensor  # (n,) on the policy's device
    all_rewards: torch.Tensor  # (N,) every process's rows
    advantages: torch.Tensor  # (n,) or (n, K) this process's rows
    selected_steps: torch.Tensor | None  # (n, K) -1 = unused slot


class RolloutEngine:
    """Turns task items into a :class:`Rollout`; holds no model of its own (the caller passes the
    old policy), so the same engine serves a frozen copy or the policy itself."""

    def __init__(self, bundle: PolicyBundle, task: Task, objective: Objective, advantage: AdvantageEstimator,
                 sampler: SamplerConfig, rollout: RolloutConfig | None = None, seed: int = 0):
        self.bundle, self.task, self.objective, self.advantage = bundle, task, objective, advantage
        # the objective's rollout order (JustGRPO's left to right); evaluation keeps the configured sampler
        self.sampler = objective.rollout_sampler(sampler)
        self.sampler.validate()
        self.cfg, self.seed = rollout or RolloutConfig(), seed
        check_tree(self.cfg.tree, sampler, bundle.block_size, objective, self.cfg.oversample)
        self.trees = self.cfg.tree if self.cfg.tree.enabled else None  # None: independent samples

    @property
    def group_size(self) -> int:
        """Rows per prompt: a tree's leaves, else ``task.group_size``."""
        return self.task.cfg.group_size if self.trees is None else self.trees.leaves

    @torch.no_grad()
    def __call__(self, items: list[dict[str, Any]], old_policy: nn.Module, rollout_id: int) -> Rollout:
        t0 = time.perf_counter()
        draw = self._sample(items, old_policy, rollout_id)
        t_score = time.perf_counter()
        ro, metrics = self._reward(draw, old_policy, rollout_id)  # scored, then revised by the objective
        ro, kept = self._keep_groups(ro)  # DAPO's dynamic sampling (rollout.oversample > 1)
        adv, adv_metrics = self._advantages(ro, rollout_id, t_score)
        metrics.update(kept | adv_metrics)
        return self._finish(ro, adv, draw, metrics, t0)

    def _sample(self, items: list[dict[str, Any]], old_policy: nn.Module, rollout_id: int) -> Draw:
        """Expand each item to ``G`` rows, encode, keep this process's share and sample their completions
        (independently, or as the leaves of trees)."""
        G, tok = self.group_size, self.bundle.tokenizer
        device = next(old_policy.parameters()).device
        prompts = [self.task.prompt(it) for it in items for _ in range(G)]
        ids, mask = encode_prompts(tok, prompts, device, self.bundle.block_size)  # (N, P)
        shard = Shard.current(ids.shape[0])  # every process padded all N rows alike; keep this one's share
        rows = shard.rows(ids.shape[0])
        ids, mask = ids[rows], mask[rows]  # (n, P)
        group_items = [it for it in items for _ in range(G)][rows]
        canvas = self.task.canvas(group_items, tok, self.sampler.gen_length, self.bundle.mask_token_id)  # (n, L) | None
        canvas = None if canvas is None else canvas.to(device)
        traj, tree = self._recorder(), None
        if self.trees is not None:
            completion, logp, entropy, cost, tree = self._grow(old_policy, ids, mask, shard.offset, rollout_id, canvas, G)
        else:
            completion, logp, entropy, cost = self._generate(old_policy, ids, mask, shard.offset, rollout_id, traj, canvas)
        pinned = None if canvas is None else canvas != self.bundle.mask_token_id  # (n, L) the task's known tokens
        return Draw(ids, mask, group_items, completion, logp, entropy, cost, shard, traj, pinned, tree)

    def _recorder(self) -> Trajectory | None:
        """The trajectory recorder the objective trains on (what the advantage estimator values rides
        along: greedy completions or the sampler's predictions); None when it trains on none."""
        if not self.objective.needs_trajectory:
            return None
        values_of = self.advantage.values_of if self.advantage.needs_values else None
        if self.bundle.noise == "uniform":  # no mask token: every step kept whole (sampling/uniform_trajectory.py)
            return UniformTrajectory(record_greedy=values_of == "greedy")
        return TrajectoryRecorder(self.bundle.mask_token_id, record_greedy=values_of == "greedy",
                                  variable_steps=self.sampler.decode != "fixed",
                                  record_prediction=self.objective.needs_predictions or values_of == "prediction",
                                  temperature=self.sampler.temperature)

    def _reward(self, draw: Draw, old_policy: nn.Module, rollout_id: int) -> tuple[Rollout, dict[str, float]]:
        """Decode and score every row drawn in one pass, and let the objective revise the rollout
        (IGPO's hinted rows). The Rollout is made here because the objective's hook and DAPO's filter
        (``Rollout.select``, generic over every per-row field) act on one; ``all_rewards`` and
        ``advantages`` are not known before the filter and hold this process's rewards until
        :meth:`_finish` sets them from the rows kept."""
        tok, eos, shard = self.bundle.tokenizer, self.bundle.eos_token_id, draw.shard
        texts = decode_completions(tok, draw.completion, eos)
        rewards, components = self._score(draw.completion, texts, draw.items)  # (n,), {name: (n,)}
        metrics: dict[str, float] = self.task.reward_metrics(texts, draw.items)  # of every row drawn
        if self.cfg.truncated_reward is not None:  # no EOS: the completion ran out of canvas
            cut = ~(draw.completion == eos).any(-1)  # (n,)
            drawn = draw.completion.shape[0] * shard.world_size
            metrics["rollout/truncated_frac"] = float(shard.all_reduce_sum(cut.float().sum()) / drawn)
        ro = Rollout(
            rollout_id=rollout_id, group_size=self.group_size, prompt_ids=draw.prompt_ids, prompt_mask=draw.prompt_mask,
            completion_ids=draw.completion, completion_mask=completion_mask(draw.completion, eos), texts=texts,
            items=draw.items, rewards=rewards, all_rewards=rewards, reward_components=components, advantages=rewards,
            shard=shard, trajectory=draw.trajectory, metrics=metrics,
            # a uniform-noise sampler draws no one token per position: its log-probs are the trajectory's
            sampler_logp=draw.sampler_logp if self.bundle.noise == "mask" else None,
            pinned=draw.pinned, tree=draw.tree,
        )
        tools = self._tools(old_policy, draw.prompt_ids, draw.prompt_mask, shard.offset, rollout_id)
        ro, revised = self.objective.revise_rollout(ro, tools)
        metrics.update(revised)
        return ro, metrics

    def _keep_groups(self, ro: Rollout) -> tuple[Rollout, dict[str, float]]:
        """DAPO's dynamic sampling: the ``1 / oversample`` share of this process's groups to train on,
        groups whose rewards differ first (in the order drawn), then the others; every per-row field
        follows (``Rollout.select``). Groups never span processes here."""
        if self.cfg.oversample == 1:
            return ro, {}
        G, n, shard, over = ro.group_size, ro.rewards.shape[0], ro.shard, self.cfg.oversample
        if n % (G * over):
            raise ConfigError("rollout.oversample", over, f"each process's {n} rows must hold whole groups of {G}, "
                              "oversample times")
        spread = ro.rewards.float().view(-1, G).std(-1) > 1e-6  # (n / G,)
        order = torch.cat([spread.nonzero()[:, 0], (~spread).nonzero()[:, 0]])[: n // G // over]
        keep = (order.sort().values[:, None] * G + torch.arange(G)).reshape(-1)  # (n / oversample,)
        stats = shard.all_reduce_sum(torch.tensor([float((~spread).sum()), float(spread.numel())], dtype=torch.float64))
        kept = ro.select(keep)
        kept.shard = Shard(shard.rank, shard.world_size, shard.rank * keep.shape[0])  # the kept rows, process-major
        return kept, {"train/frac_zero_std_groups": float(stats[0] / stats[1]),  # of every group drawn
                      "rollout/kept_zero_std_frac": float((~spread[order]).float().mean())}

    def _advantages(self, ro: Rollout, rollout_id: int, t_score: float) -> tuple[Advantages, dict[str, float]]:
        """The steps the objective trains on, every process's rewards (a group may span processes),
        the per-token rewards and step values the estimator needs, and the advantages of the rows kept."""
        metrics: dict[str, float] = {}
        steps = None
        if ro.trajectory is not None:
            steps, step_metrics = self.objective.select_steps(ro.trajectory, ro.completion_ids, ro.completion_mask,
                                                              self.bundle.eos_token_id, rollout_id, self.seed)
            metrics.update(step_metrics)
        rewards = ro.rewards.to(ro.prompt_ids.device)
        all_rewards = ro.shard.gather(rewards)  # (N,)
        values = valid = token_rewards = None
        if self.advantage.needs_token_rewards:  # each token's own share of its completion's reward
            token_rewards = ro.shard.gather(self._per_token(ro.completion_ids, ro.items, self.task.token_rewards, 0.0))
        if self.advantage.needs_values:  # the one-step completions at the selected steps
            values, valid = self._step_values(ro, steps, rewards)
        metrics["time/score_s"] = time.perf_counter() - t_score
        adv, adv_metrics = self.advantage(all_rewards, ro.group_size, values, valid, token_rewards)
        metrics.update(adv_metrics)
        return Advantages(rewards, all_rewards, adv[ro.shard.rows(adv.shape[0])], steps), metrics

    def _step_values(self, ro: Rollout, steps: torch.Tensor | None,
                     rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every process's value of each selected step, the reward of its one-step completion (N, K),
        and which slots are used (N, K); an unused slot holds the row's own reward."""
        assert ro.trajectory is not None and steps is not None
        one_step, one_step_rows = self._step_completions(ro.trajectory, steps, ro.completion_ids)
        one_step_rewards, _ = self.task.score(decode_completions(self.bundle.tokenizer, one_step, self.bundle.eos_token_id),
                                              [ro.items[b] for b in one_step_rows.tolist()])
        valid = steps >= 0
        step_values = rewards.float()[:, None].expand(steps.shape).clone()  # unused slots: V = r(x_0)
        step_values[valid] = one_step_rewards.to(step_values)
        return ro.shard.gather(step_values), ro.shard.gather(valid)

    def _finish(self, ro: Rollout, adv: Advantages, draw: Draw, metrics: dict[str, float], t0: float) -> Rollout:
        """The rollout's metrics (the reward, length and entropy of the rows kept; the sampler's cost of
        every row drawn) and its fields that depend on the rows kept."""
        shard, G, all_rewards = ro.shard, ro.group_size, adv.all_rewards
        t_roll = time.perf_counter() - t0
        group_std = all_rewards.view(-1, G).std(-1)
        lengths = shard.gather(ro.completion_mask.sum(-1))  # (N,)
        ent = shard.all_reduce_sum(draw.entropy)
        drawn = draw.completion.shape[0]  # this process's rows, before dynamic sampling kept some
        metrics.setdefault("train/frac_zero_std_groups", (group_std < 1e-6).float().mean().item())
        metrics.update({
            "train/reward": all_rewards.mean().item(),
            "train/reward_std": all_rewards.std().item() if all_rewards.numel() > 1 else 0.0,
            "train/completion_len": lengths.float().mean().item(),
            "train/entropy": float(ent[0] / ent[1].clamp_min(1)),
            "time/rollout_s": t_roll,
            "throughput/tokens_per_s": draw.completion.numel() * shard.world_size / max(t_roll, 1e-9),
        })
        metrics.update(cost_metrics(draw.cost, drawn, ro.completion_ids.shape[1]))
        if shard.world_size > 1:  # per-process metrics of the rewards, selection and cost: mean over equal shares
            keys = [k for k in metrics if k.startswith(("egspo/", "igpo/", "rollout/", "reward/"))]
            vals = shard.all_reduce_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64,
                                                     device=ro.prompt_ids.device))
            metrics.update(zip(keys, (vals / shard.world_size).tolist()))
        loss_mask = (self._per_token(ro.completion_ids, ro.items, self.task.reward_token_mask, 1.0)
                     if self.task.cfg.loss_mask == "reward" else None)
        return replace(ro, rewards=adv.rewards, all_rewards=all_rewards, advantages=adv.advantages,
                       selected_steps=adv.selected_steps, metrics=metrics, loss_mask=loss_mask,
                       tree=None if ro.tree is None else ro.tree.score(adv.rewards))

    def _score(self, completion: torch.Tensor, texts: list[str],
               items: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The task's rewards of decoded completions (n,) and their components; ``truncated_reward`` for a
        completion with no EOS."""
        rewards, components = self.task.score(texts, items)
        if self.cfg.truncated_reward is not None:  # no EOS: the completion ran out of canvas
            cut = ~(completion == self.bundle.eos_token_id).any(-1).to(rewards.device)  # (n,)
            rewards = torch.where(cut, torch.tensor(self.cfg.truncated_reward, dtype=rewards.dtype, device=rewards.device),
                                  rewards)
        return rewards, components

    def _tools(self, old_policy: nn.Module, ids: torch.Tensor, mask: torch.Tensor, offset: int,
               rollout_id: int) -> RolloutTools:
        """The sampler, decoder and rewards of this rollout for the objective's hook (``revise_rollout``);
        a resample of rows ``first ..`` draws its own noise (``_RESAMPLE_SALT``), keyed by global row."""
        def resample(first: int, canvas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            rows = slice(first, first + canvas.shape[0])
            completion, logp, _, _ = self._generate(old_policy, ids[rows], mask[rows], offset + first, rollout_id, None,
                                                    canvas.to(ids.device), salt=_RESAMPLE_SALT)
            return completion, logp

        eos = self.bundle.eos_token_id
        return RolloutTools(task=self.task, tokenizer=self.bundle.tokenizer, mask_id=self.bundle.mask_token_id,
                            eos_id=eos, run_seed=self.seed, sample=resample,
                            decode=lambda comp: decode_completions(self.bundle.tokenizer, comp, eos),
                            score=self._score, old_policy=logits_fn(old_policy))

    def _per_token(self, completion: torch.Tensor, items: list[dict[str, Any]], fn, default: float) -> torch.Tensor:
        """(n, L) float of a task's per-token function of the decoded tokens (``reward_token_mask``,
        ``token_rewards``); ``default`` where the task returns None."""
        out = torch.full(completion.shape, default, dtype=torch.float32, device=completion.device)
        tok = self.bundle.tokenizer
        for b, (row, item) in enumerate(zip(completion.tolist(), items)):
            values = fn(item, tok.batch_decode([[t] for t in row]))  # each token's text, in order
            if values is not None:
                out[b] = torch.tensor([float(v) for v in values], dtype=torch.float32)
        return out

    def _generate(self, net: nn.Module, ids: torch.Tensor, mask: torch.Tensor, offset: int, rollout_id: int,
                  recorder: Trajectory | None,
                  canvas: torch.Tensor | None = None,
                  salt: int = _GUMBEL_SALT) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Completions (n, L), the sampler's log-prob of each of their tokens (n, L), ``[entropy sum,
        committed tokens]`` (2,) float64 and the cost ``[forwards, forward tokens, steps, filled tokens,
        edited tokens]`` (5,) float64 summed over this process's rows."""
        was_training = net.training
        net.eval()
        n = ids.shape[0]
        size = self.sampler.rollout_batch_size or n
        parts, logps = [], []
        ent = torch.zeros(2, dtype=torch.float64, device=ids.device)
        cost = torch.zeros(5, dtype=torch.float64, device=ids.device)
        key = mix_seed(self.seed, rollout_id, salt)
        for s in range(0, n, size):
            # each row keyed by its global row: the same rows draw the same noise in any chunks, on any number of processes
            noise = RowNoise.rows(key, offset + s, ids[s:s + size].shape[0])
            out = sample(self.bundle, ids[s:s + size], mask[s:s + size], self.sampler, noise, recorder, net=net,
                         canvas=None if canvas is None else canvas[s:s + size])
            parts.append(out.completion)
            logps.append(tally(out, ent, cost))
        net.train(was_training)
        return torch.cat(parts), torch.cat(logps), ent, cost

    def _grow(self, net: nn.Module, ids: torch.Tensor, mask: torch.Tensor, offset: int, rollout_id: int,
              canvas: torch.Tensor | None, G: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Tree]:
        """Tree rollouts (``rl/tree.py``): as :meth:`_generate`, and the trees. A leaf's sampler log-probs
        are those of the nodes on its path (each position is committed at one of them); the cost
        counts every node's sampler calls, per leaf."""
        if offset % G or ids.shape[0] % G:
            raise ConfigError("rollout.tree.branches", self.cfg.tree.branches,
                              f"each process must hold whole trees of {G} leaves (task.prompts_per_batch per process)")
        was_training = net.training
        net.eval()
        mask_id, size = self.bundle.mask_token_id, self.sampler.rollout_batch_size

        def grow(p: torch.Tensor, m: torch.Tensor, c: torch.Tensor, noise: RowNoise, a: int, b: int) -> SampleOutput:
            step = size or p.shape[0]
            # a tree runs the masked-diffusion sampler: check_tree refused a block model
            outs = [sample(self.bundle, p[s:s + step], m[s:s + step], self.sampler, RowNoise(noise.seeds[s:s + step]),
                           net=net, canvas=c[s:s + step], start_step=a, stop_step=b)
                    for s in range(0, p.shape[0], step)]
            return merge_outputs(outs)

        start = torch.full((ids.shape[0], self.sampler.gen_length), mask_id, dtype=ids.dtype, device=ids.device)
        if canvas is not None:
            start = canvas.to(ids)
        key = mix_seed(self.seed, rollout_id, _GUMBEL_SALT)
        tree, outs = grow_trees(self.cfg.tree, self.sampler.steps, ids, mask, start, grow, key, offset // G)
        ent = torch.zeros(2, dtype=torch.float64, device=ids.device)
        cost = torch.zeros(5, dtype=torch.float64, device=ids.device)
        logp = []  # (nodes at depth d, L) each level's own committed tokens
        for d, out in enumerate(outs):
            if out is None:  # roots that are the start canvas: nothing committed
                logp.append(torch.zeros(int((tree.depth == d).sum()), start.shape[1], device=ids.device))
                continue
            logp.append(tally(out, ent, cost))
        node_logp = torch.cat(logp)  # (M, L) each node's own committed tokens
        for d in range(1, int(tree.depth.max()) + 1):  # a node's path: its parent's path and its own
            at = (tree.depth == d).nonzero()[:, 0]
            node_logp[at] += node_logp[tree.parent[at]]
        net.train(was_training)
        return tree.states[tree.leaf], node_logp[tree.leaf], ent, cost, tree

    def _step_completions(self, traj: Trajectory | None, steps: torch.Tensor | None,
                          completion: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The one-step completions the advantage estimator values (``values_of``: greedy or the
        sampler's predictions) at every selected step, (m, L), and the row of each (m,); none unless
        it needs their values."""
        if traj is None or steps is None or not self.advantage.needs_values:
            return completion[:0], torch.zeros(0, dtype=torch.long)
        if self.advantage.values_of == "prediction":
            assert isinstance(traj, TrajectoryRecorder), "the sampler's predictions are a masking sampler's (MDPO)"
            rebuild = traj.prediction
        else:
            rebuild = traj.greedy_completion
        L = completion.shape[1]
        bi, ki = (steps >= 0).nonzero(as_tuple=True)  # (m,) each
        sel = steps[bi, ki]  # (m,)
        comps = completion.new_empty(sel.numel(), L)
        for s in sel.unique().tolist():  # one reconstruction per distinct step
            hit = sel == s
            comps[hit] = rebuild(s)[bi[hit], -L:].to(comps.dtype)
        return comps, bi


def merge_outputs(outs: list[SampleOutput]) -> SampleOutput:
    """One sampler output of several calls over consecutive rows (the same schedule): tensors
    concatenated, the per-row cost averaged over the rows."""
    if len(outs) == 1:
        return outs[0]
    rows = [o.completion.shape[0] for o in outs]
    n = sum(rows)

    def cat(name: str) -> torch.Tensor:
        return torch.cat([getattr(o, name) for o in outs])

    def mean(name: str) -> float:
        return sum(r * float(getattr(o, name)) for r, o in zip(rows, outs)) / n

    return SampleOutput(cat("sequences"), cat("completion"), cat("entropy_sum"), cat("num_committed"),
                        cat("token_logp"), round(mean("forwards")), round(mean("forward_tokens")),
                        round(mean("steps")), mean("filled"), mean("edited"))


def tally(out: SampleOutput, ent: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
    """Add one sampler call's ``[entropy sum, committed tokens]`` to ``ent`` (2,) and its cost
    ``[forwards, forward tokens, steps, filled, edited]``, per row times its rows, to ``cost`` (5,), in
    place. -> the sampler's log-prob of each token it committed (rows, L)"""
    assert out.entropy_sum is not None and out.num_committed is not None
    ent += torch.stack([out.entropy_sum.sum(), out.num_committed.sum().double()])
    cost += out.completion.shape[0] * torch.tensor([out.forwards, out.forward_tokens, out.steps, out.filled,
                                                    out.edited], dtype=torch.float64, device=cost.device)
    if out.token_logp is None:  # a uniform-noise sampler: no one draw per token (its steps are recorded instead)
        return torch.zeros_like(out.completion, dtype=torch.float32)
    return out.token_logp


def cost_metrics(cost: torch.Tensor, rows: int, gen_length: int) -> dict[str, float]:
    """Per-sample sampler cost from ``[forwards, forward tokens, steps, filled tokens, edited tokens]``
    summed over ``rows`` samples (see the module docstring)."""
    forwards, tokens, steps, filled, edited = (v / max(rows, 1) for v in cost.tolist())
    return {
        "rollout/forwards_per_sample": forwards,
        "rollout/forward_tokens_per_sample": tokens,
        "rollout/steps_per_sample": steps,
        "rollout/tokens_per_forward": gen_length / max(forwards, 1e-9),
        "rollout/filled_frac": filled / gen_length,
        "rollout/edited_per_sample": edited,
    }
