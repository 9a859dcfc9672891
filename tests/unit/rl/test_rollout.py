"""The rollout engine (rl/rollout.py): one scoring pass, the reward's loss mask and dynamic sampling (DAPO);
under every sampler option EGSPO's replay at theta = theta_old gives a step ratio of exactly 1, the
sampler's log-probs ride on the rollout and its cost is logged."""

import itertools
from dataclasses import dataclass, fields, replace

import pytest
import torch

from diffusion_rl.app.train import build
from diffusion_rl.core.distributed import Shard
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.likelihood.base import LikelihoodConfig
from diffusion_rl.likelihood.one_step import OneStepEstimator
from diffusion_rl.models.build import build_policy
from diffusion_rl.models.heads import logits_outputs
from diffusion_rl.models.policy import ModelConfig, encode_prompts, logits_fn
from diffusion_rl.models.tiny import TinyDiffusionLM
from diffusion_rl.rl.advantages import ADVANTAGES
from diffusion_rl.rl.batch import Rollout
from diffusion_rl.rl.objectives.base import StepContext
from diffusion_rl.rl.objectives.egspo import EGSPO, EGSPOConfig
from diffusion_rl.rl.objectives.egspo_sa import EGSPOSA, EGSPOSAConfig
from diffusion_rl.rl.rollout import RolloutConfig, RolloutEngine
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate
from diffusion_rl.sampling.trajectory import TrajectoryRecorder
from tests.helpers.common import compose_cfg
from tests.unit.rl.test_egspo import TextTask  # a reward that depends on the text


def engine_of(c, oversample=1, advantage=None):
    adv = c.advantage
    if advantage is not None:
        cls = ADVANTAGES.get(advantage)
        adv = cls(cls.config_class())
    return RolloutEngine(c.bundle, c.task, c.objective, adv, c.sampler, RolloutConfig(oversample=oversample), seed=3)


def test_loss_mask_gives_given_cells_no_gradient(tmp_path):
    c = build(compose_cfg(["task.loss_mask=reward", "objective.beta=0"], tmp_path))
    items = c.task.splits.train[:2]
    ro = engine_of(c)(items, c.bundle.net, 0)
    for b in range(ro.completion_ids.shape[0]):
        pieces = c.bundle.tokenizer.batch_decode([[t] for t in ro.completion_ids[b].tolist()])
        assert ro.loss_mask[b].tolist() == [float(k) for k in c.task.reward_token_mask(ro.items[b], pieces)]
    assert 0 < ro.loss_mask.mean() < 1
    # nonzero advantages whatever the untrained model earned: the mask alone must zero the gradient
    ro = replace(ro, advantages=torch.linspace(-1.0, 1.0, ro.advantages.shape[0]))
    # d loss / d logits is exactly zero at the completion tokens the reward ignores
    net, P = c.bundle.net, ro.prompt_ids.shape[1]
    seen = []

    def forward(ids, attn, position_ids=None):
        logits = logits_fn(net)(ids, attn).detach().requires_grad_(True)
        seen.append(logits)
        return logits

    old = logits_fn(net)
    loss, _ = c.objective.loss(StepContext(ro, 0, 3, forward, old, None))
    loss.backward()
    grad = seen[-1].grad[:, P:].abs().sum(-1)  # (n, L)
    ignored = (ro.loss_mask == 0) & (ro.completion_mask > 0)
    assert bool(ignored.any()) and float(grad[ignored].sum()) == 0.0
    assert float(grad[ro.scored_mask > 0].sum()) > 0


def test_dynamic_sampling_keeps_the_groups_whose_rewards_differ(tmp_path):
    c = build(compose_cfg(["task.prompts_per_batch=4", "task.group_size=4"], tmp_path))
    items = c.task.splits.train[:8]
    full = engine_of(c)(items, c.bundle.net, 0)  # the same draws: the noise is keyed by rollout and row
    kept = engine_of(c, oversample=2)(items, c.bundle.net, 0)
    spread = full.rewards.view(-1, 4).std(-1) > 1e-6
    order = torch.cat([spread.nonzero()[:, 0], (~spread).nonzero()[:, 0]])[:4].sort().values
    rows = (order[:, None] * 4 + torch.arange(4)).reshape(-1)
    assert torch.equal(kept.completion_ids, full.completion_ids[rows])
    assert torch.equal(kept.rewards, full.rewards[rows]) and kept.texts == [full.texts[i] for i in rows.tolist()]
    assert kept.metrics["train/frac_zero_std_groups"] == pytest.approx(float((~spread).float().mean()))
    assert kept.advantages.shape[0] == 16 and kept.all_rewards.shape == (16,)  # per cell on Sudoku: (16, L)
    expect = full.select(rows)  # the fields made before the filter are the full rollout's rows
    for name in ("prompt_ids", "prompt_mask", "completion_mask", "sampler_logp"):
        assert torch.equal(getattr(kept, name), getattr(expect, name)), name
    assert kept.items == expect.items and kept.reward_components.keys() == expect.reward_components.keys()
    with pytest.raises(ConfigError, match="rollout.oversample"):
        engine_of(c, oversample=3)(items, c.bundle.net, 0)  # 32 rows are not 3 x whole groups


def test_trajectory_select_keeps_each_samples_record(tiny_bundle):
    ids, mask = encode_prompts(tiny_bundle.tokenizer, ["1203=", "40", "0000000=", "12"])
    rec = TrajectoryRecorder(tiny_bundle.mask_token_id)
    generate(logits_fn(tiny_bundle.net.eval()), ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4,
             temperature=0.9), tiny_bundle.mask_token_id, RowNoise.rows(0, 0, ids.shape[0]), rec)
    rows = torch.tensor([3, 1])
    sub = rec.select(rows)
    assert torch.equal(sub.final, rec.final[rows]) and torch.equal(sub.entropies, rec.entropies[rows])
    for s in range(rec.num_steps):
        assert torch.equal(sub.state_before(s), rec.state_before(s)[rows])
        assert torch.equal(sub.greedy_completion(s), rec.greedy_completion(s)[rows])


def every_field_rollout(tiny_bundle) -> Rollout:
    """A rollout of 4 rows with every field set (none left None), each per-row value distinct per row."""
    ids, mask = encode_prompts(tiny_bundle.tokenizer, ["1203=", "40", "0000000=", "12"])
    rec = TrajectoryRecorder(tiny_bundle.mask_token_id)
    comp = generate(logits_fn(tiny_bundle.net.eval()), ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4),
                    tiny_bundle.mask_token_id, RowNoise.rows(0, 0, ids.shape[0]), rec).completion
    n, r = 4, torch.arange(4.0)
    return Rollout(
        rollout_id=5, group_size=2, prompt_ids=ids, prompt_mask=mask, completion_ids=comp,
        completion_mask=torch.ones_like(comp), texts=[f"t{i}" for i in range(n)], items=[{"i": i} for i in range(n)],
        rewards=r, all_rewards=torch.arange(8.0), reward_components={"a": 2 * r, "b": 3 * r},
        advantages=r[:, None].expand(n, 3) + torch.arange(3.0), shard=Shard(0, 2, 0), trajectory=rec,
        selected_steps=torch.arange(n)[:, None].repeat(1, 2), metrics={"m": 1.0},
        loss_mask=torch.rand(comp.shape), sampler_logp=-torch.rand(comp.shape), pinned=torch.rand(comp.shape) > 0.5,
        extras={"hints": torch.rand(comp.shape) > 0.5, "hint_entropy": torch.rand(comp.shape)},
    )


WHOLE = {"tree"}  # fields select() refuses rather than split (test_a_tree_rollout_is_not_split)


def test_rollout_select_keeps_the_rows_of_every_per_row_field(tiny_bundle):
    ro = every_field_rollout(tiny_bundle)
    unset = [f.name for f in fields(Rollout) if getattr(ro, f.name) is None and f.name not in WHOLE]
    assert not unset, f"set {unset} in every_field_rollout so this test checks that select() keeps their rows"
    # the fields select() leaves alone; a field added here must not be one value per row
    assert Rollout.NOT_PER_ROW == {"rollout_id", "group_size", "all_rewards", "shard", "metrics"}
    keep = torch.tensor([3, 1])
    sub = ro.select(keep)
    for f in fields(Rollout):
        old, new = getattr(ro, f.name), getattr(sub, f.name)
        if f.name in WHOLE:
            continue
        if f.name in Rollout.NOT_PER_ROW:
            assert new is old, f.name
        elif isinstance(old, torch.Tensor):
            assert torch.equal(new, old[keep]), f.name
        elif isinstance(old, list):
            assert new == [old[i] for i in keep.tolist()], f.name
        elif isinstance(old, dict):
            assert old.keys() == new.keys() and all(torch.equal(new[k], v[keep]) for k, v in old.items()), f.name
        elif isinstance(old, TrajectoryRecorder):
            assert torch.equal(new.final, old.final[keep]), f.name
            assert all(torch.equal(new.state_before(s), old.state_before(s)[keep]) for s in range(old.num_steps))
        else:
            pytest.fail(f"Rollout.{f.name}: a {type(old).__name__}, which this test cannot check")
    by_mask = ro.select(torch.tensor([False, True, False, True]))  # a bool mask keeps rows in their order
    assert torch.equal(by_mask.completion_ids, ro.completion_ids[[1, 3]]) and by_mask.texts == ["t1", "t3"]


def test_a_tree_rollout_is_not_split(tiny_bundle):
    """A tree's nodes hold every leaf's ancestors: select() refuses it in one line rather than keep a
    tree whose leaves are gone (tree rollouts refuse rollout.oversample > 1 before they start)."""
    from diffusion_rl.rl.tree import Tree

    ro = replace(every_field_rollout(tiny_bundle), tree=Tree.__new__(Tree))
    with pytest.raises(TypeError, match="rollout.oversample must be 1 with rollout.tree"):
        ro.select(torch.tensor([3, 1]))


def test_rollout_select_covers_a_new_field_and_refuses_one_it_cannot_split(tiny_bundle):
    @dataclass
    class WithExtra(Rollout):
        extra: torch.Tensor | None = None  # (n, 2), a field select() was never told about

    ro = every_field_rollout(tiny_bundle)
    ext = WithExtra(**{f.name: getattr(ro, f.name) for f in fields(ro)}, extra=torch.arange(8).view(4, 2))
    assert torch.equal(ext.select(torch.tensor([2, 0])).extra, torch.tensor([[4, 5], [0, 1]]))
    with pytest.raises(TypeError, match=r"Rollout\.extra"):  # not one value per row: no silent pass-through
        replace(ext, extra=torch.zeros(5)).select(torch.tensor([0]))


ITEMS = [{"prompt": "1203="}, {"prompt": "0000000="}, {"prompt": "12"}]  # left padding is exercised
EOS_FROM = 8  # position id from which EndsEarly prefers EOS: by completion token 6 of every row (block 1)


class EndsEarly(TinyDiffusionLM):
    """The embedded model, biased towards EOS from a completion position on (so every row ends)."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                keep=None, targets=None, select=None):
        out = super().forward(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        if position_ids is None:
            past = 0 if past_key_values is None else past_key_values[0][0].shape[-2]
            if attention_mask is not None and attention_mask.dim() == 2:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
            else:
                position_ids = torch.arange(past, past + input_ids.shape[1]).expand_as(input_ids)
        late = (position_ids >= EOS_FROM)[..., None]  # (B, L, 1) positions count from the first real token
        logits = out.logits + 30.0 * late * torch.nn.functional.one_hot(torch.tensor(self.eos), out.logits.shape[-1])
        res = logits_outputs(logits, keep, targets, select)  # the policy interface's keep / targets (models/heads.py)
        res.past_key_values = out.past_key_values
        return res


def _bundle(ends_early: bool):
    torch.manual_seed(0)
    b = build_policy(ModelConfig(d_model=32, n_layers=2, n_heads=2))
    if ends_early:
        net = EndsEarly(b.net.config)
        net.load_state_dict(b.net.state_dict())
        net.eos = b.eos_token_id
        b.net = net
    with torch.no_grad():
        for p in b.net.parameters():
            p.mul_(4.0)  # confident predictions: threshold decoding commits several tokens per step
    return b


def _rollout(bundle, objective, advantage="group", **sampler_kw):
    cls = ADVANTAGES.get(advantage)
    sampler = SamplerConfig(gen_length=12, block_length=4, steps=6, temperature=0.9, **sampler_kw)
    return RolloutEngine(bundle, TextTask(), objective, cls(cls.config_class()), sampler, seed=1)(ITEMS, bundle.net, 0)


OPTIONS = [dict(decode=d, kv_cache=c, stop_after_eos=s, threshold=0.3)
           for d, c, s in itertools.product(("fixed", "threshold", "factor"), ("none", "prefix", "dual"), (False, True))]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: f"{o['decode']}-{o['kv_cache']}-{'stop' if o['stop_after_eos'] else 'full'}")
def test_egspo_step_ratio_is_exactly_one_under_every_sampler_option(opts):
    bundle = _bundle(ends_early=opts["stop_after_eos"])
    lik = OneStepEstimator(LikelihoodConfig(), bundle.mask_token_id)
    kw = dict(K=4, mu=1, old_logp="recompute")  # the old policy replays each step: exactly the policy's
    obj = EGSPOSA(EGSPOSAConfig(**kw), lik) if opts["kv_cache"] == "prefix" else EGSPO(EGSPOConfig(**kw), lik)
    ro = _rollout(bundle, obj, "stepwise" if opts["kv_cache"] == "prefix" else "group", **opts)
    traj, steps = ro.trajectory, ro.selected_steps
    assert torch.equal(traj.final[:, -12:], ro.completion_ids)
    valid = steps >= 0
    assert bool(valid.any())
    assert bool((traj.counts.gather(1, steps.clamp_min(0)) > 0)[valid].all())  # every selected step committed a token
    if opts["stop_after_eos"]:  # a row takes EOS without a forward from the end of the block of its first EOS on
        eos = bundle.eos_token_id
        first = (ro.completion_ids == eos).int().argmax(-1)  # (N,) every row ends
        filled = (12 - (first // 4 + 1) * 4).clamp_min(0).float()  # (N,)
        assert (filled > 0).all() and filled.min() < filled.max()  # rows end in different blocks
        assert ro.metrics["rollout/filled_frac"] == pytest.approx(filled.mean().item() / 12)
        if opts["decode"] == "fixed":  # until the last row has ended: its first two blocks
            assert ro.metrics["rollout/forwards_per_sample"] == 4
    f = logits_fn(bundle.net)
    loss, m = obj.loss(StepContext(ro, 0, 0, f, f, None))
    assert m["ratio/log_max"].item() == 0 and m["ratio/log_min"].item() == 0  # exactly 1, not approximately
    assert torch.isfinite(loss)
    if opts["kv_cache"] == "none":  # the sampler's own step log-probs are the replay's, up to float batching
        assert abs(m["rollout/mismatch_log_ratio"].item()) < 1e-4
    for key in ("rollout/forwards_per_sample", "rollout/forward_tokens_per_sample", "rollout/steps_per_sample",
                "rollout/tokens_per_forward"):
        assert ro.metrics[key] > 0


def test_a_stale_cache_shows_as_mismatch_and_tis_corrects_it():
    bundle = _bundle(ends_early=False)
    lik = OneStepEstimator(LikelihoodConfig(), bundle.mask_token_id)
    f = logits_fn(bundle.net)
    out = {}
    for cache in ("none", "dual"):
        obj = EGSPO(EGSPOConfig(K=4, mu=1, old_logp="recompute", behaviour_correction="tis"), lik)
        ro = _rollout(bundle, obj, kv_cache=cache)
        out[cache] = obj.loss(StepContext(ro, 0, 0, f, f, None))[1]
    assert abs(out["none"]["rollout/mismatch_log_ratio"].item()) < 1e-4
    assert out["none"]["tis/weight_mean"].item() == pytest.approx(1.0, abs=1e-4)
    assert out["dual"]["rollout/mismatch_log_ratio_std"].item() > 1e-3  # stale keys and values: not the policy's
    assert out["dual"]["tis/weight_mean"].item() != pytest.approx(1.0, abs=1e-4)


def test_rollout_carries_the_samplers_log_probs_and_cost():
    bundle = _bundle(ends_early=False)
    obj = EGSPO(EGSPOConfig(K=2, mu=1), OneStepEstimator(LikelihoodConfig(), bundle.mask_token_id))
    exact = _rollout(bundle, obj)
    fast = _rollout(bundle, obj, decode="threshold", threshold=0.3, kv_cache="dual")
    for ro in (exact, fast):
        assert ro.sampler_logp.shape == ro.completion_ids.shape and bool((ro.sampler_logp <= 0).all())
        # per step, the sampler's token log-probs sum to the trajectory's recorded step log-probs
        cs = ro.trajectory.commit_step.long()[:, -12:]
        per_step = torch.stack([(ro.sampler_logp * (cs == s)).sum(-1) for s in range(ro.trajectory.num_steps)], 1)
        assert torch.allclose(per_step, ro.trajectory.logps, atol=1e-5)
    assert exact.metrics["rollout/steps_per_sample"] == 6 and exact.metrics["rollout/tokens_per_forward"] == 2
    assert exact.metrics["rollout/forward_tokens_per_sample"] == 6 * exact.trajectory.final.shape[1]
    assert fast.metrics["rollout/forward_tokens_per_sample"] < exact.metrics["rollout/forward_tokens_per_sample"]
