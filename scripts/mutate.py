"""Mutation testing of the math (docs/mutation.md): mutmut changes one thing at a time in a module
(``/`` to ``*``, ``<`` to ``<=``, a constant, a dropped argument) and runs the tests of the module's
own area, ``tests/unit/<area>``; a mutant no test notices is a wrong formula the tests would let through.

    python scripts/mutate.py rl/advantages.py                    # one module (a path under src/diffusion_rl)
    python scripts/mutate.py sampling/sampler.py sampling/noise.py
    python scripts/mutate.py all                                 # every module of --list, one after another
    python scripts/mutate.py --list                              # the modules and the tests each runs against
    python scripts/mutate.py rl/advantages.py --dry-run          # the folder, config and command; runs nothing
    python scripts/mutate.py rl/advantages.py --rescore          # the last run scored with today's equivalents
    nice -n 19 python scripts/mutate.py all --max-children 1     # on a machine shared with a training run

Each module runs in a fresh folder ``.mutation/<module>/`` (git ignores it): links to ``src``, ``tests``
and the folders the tests read, and a ``pyproject.toml`` that is the repository's plus the
``[tool.mutmut]`` table of that module (only that file mutated, only its area's tests run). mutmut copies
it all into ``mutants/`` beside it and runs each mutant against the tests that call the mutated function.
The summary line per module gives mutants, killed (a timeout counts as killed), survived, no tests,
equivalent (:data:`EQUIVALENT`: no test can tell them from the original, each with its reason) and the
score ``killed / (all - equivalent)``; each survivor's diff follows (``.mutation/<module>/survivors.txt``).
Not part of CI (minutes per module); ``tests/contract/test_mutation_config.py`` checks that this
configuration still builds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "diffusion_rl"
WORK = ROOT / ".mutation"

# the package folders whose errors change results, and the tests each is held to
AREAS = ("rl", "likelihood", "sampling", "rewards", "tasks")
# in those folders, what is not the math: process plumbing, loading, prompts and task definitions (the
# task's metrics are in tasks/base.py and tasks/sudoku.py, its rewards in rewards/)
EXCLUDED = {
    "rewards/verify_pool.py": "a process pool around the answer checkers (tests/unit/sandbox)",
    "rewards/verify_worker.py": "the pool's worker process",
    "rl/objectives/egspo_sa.py": "a config and a registration, no function body for mutmut to mutate; the estimator it "
                                 "requires is tested in tests/unit/rl/test_egspo.py and the stepwise formula in rl/advantages.py",
    "tasks/loading.py": "reads dataset files",
    "tasks/code.py": "prompts and reward wiring of the code tasks",
    "tasks/humaneval.py": "loads HumanEval",
    "tasks/mbpp.py": "loads MBPP",
    "tasks/countdown.py": "instance generation and prompts (the reward is rewards/countdown.py)",
    "tasks/gsm8k.py": "loads GSM8K and its prompts (the reward is rewards/gsm8k.py)",
    "tasks/math500.py": "loads MATH500 and its prompts (the reward is rewards/math500.py)",
    "tasks/order.py": "the order of training items",
    "tasks/text.py": "prompts and reward wiring of the text tasks",
}
# folders the area tests read besides src/ and tests/ (conf/ for configs, docs/ for the tables they
# check, scripts/ for the scripts they run)
ALSO_COPY = ("conf", "docs", "scripts")

# Areas whose mutants run under mutmut's fork server (``process_isolation = "forkserver"``) instead of
# a fork of the process that ran the tests once: the tasks' tests start the code sandbox's fork server
# as a child of that process, and mutmut's default runner reaps children with ``os.wait()``, so when that
# child exits the run stops on a pid it does not know (``KeyError`` in ``ForkRunner.wait_for_result``).
FORKSERVER_AREAS = ("tasks",)

# Statements not mutated: the words and type of an error (``raise ...``), an ``assert`` (an invariant of
# the code's own calls, which no valid input reaches), a warning and a log line. Whether the
# error is raised is the condition above it, which is mutated; what the message says is not the math,
# and a test matching a message's every word would be a snapshot of it. mutmut reads these as regular
# expressions searched in each line, and skips every statement that starts on a matching line.
NOT_MUTATED = (r"^\s*raise\b", r"^\s*assert\b", r"^\s*warnings\.warn\(",
               r"^\s*(log|logger)\.(debug|info|warning|error)\(",
               r"^\s*_warn_once\(")  # rewards/math500.py's log.warning, once per key

# Equivalent mutants: no test can tell them from the original. Keyed by mutmut's name, with the line
# as the mutant reads it (an entry whose line no longer matches the mutant is stale and counts as a
# survivor) and why it is equivalent.
_AXIS_2D = "the same axis: dim +1 of a 2-D tensor is dim -1"
_RAND_OUT = "torch.rand with out=: the out tensor's dtype is the draw's"
_CPU = "no device given: the tensors are made on the one device the tests have, the CPU"
_NONE_FALSE = "read as a truth value only: None and False alike"
_BLOCK_END = "at a block end the completion up to it is committed: no mask is left to compare with"
_SELECT = ("every position scored instead of the masked ones only: the same log-probs where they are read (masked "
           "positions), a cost only")
_GATHER = "one process: gather is the identity, of None too (the data-parallel runs are tests/e2e's)"
_NOT_IGNORED = "the KL covers the completion for every value but ignored"
_NOT_KEPT = "the batch kept for the update is built again at each call: the same batch, a cost only"
_SALT = "another salt or none: a stream as independent of the others; a test could only restate the constant"
_INT_FILL = "torch.full infers int64 from an integer fill: the long dtype given"
_ONE_PASS = "one_pass changes the cost, not the values: both scorers are tested equal (test_staircase.py)"
_DEFAULT_F32 = "no dtype: float32, the default, is the one given"
_ALL_ONES = "an all-ones attention mask where there is no padding: the same logits as none"
_TIE = "< and <= differ only where a uniform number equals the rate exactly, which no test's seed draws"
_RANDINT = "torch.randint(high, size) is torch.randint(0, high, size): the same call"
_FOUND_AFTER_TAG = "a close tag found after the open one is at a position > 0: < 0, <= 0 and < 1 read the same"
_COST_ONLY = "chunks under checkpointing give the values and gradients of one pass (a test checks it): a cost only"
_MEAN_NO_T = "the 'mean' reduction averages the scored log-probs and reads no masking rate"
_ROLE_SPELLING = "the masks read the role only as 'old' or not: another spelling of this role draws the same masks"
_NO_GROUPS = "bgpo_loss reads no group size (its token mean is over every covered unit)"
_METRICS_ONLY = ("only the metrics ([1]) are read, and with behaviour_correction=none (BGPO refuses tis) they read "
                 "neither the advantages nor the cap")
_NONE_END = "str.find and a slice read an end of None as the string's end: the same as len(text)"
_WARNED_KEY = "the set of warned keys kept under another key of _state, which nothing else reads"
_WARM_GOLD = "the warm-up's gold: any answer math-verify parses; which sympy paths it warms up is a cost, not a verdict"
_FLAGS_KEPT = ("no default needed: a restore follows a deadline inside math-verify, which loads only after sympy's flags "
               "are recorded")
_AFTER_TAG = "a position found after a tag is at least the tag's length, or -1: > 0, >= 0 and >= 1 read the same"
_NO_OVERLAP = ("no '</answer>' can begin in the 8 characters before an '<answer>' or inside it (it would overlap it): "
               "searched from there or from after the tag, the same close is found")
_BELOW_BODY = "the first candidate looks its close and line end up for any start value below its body (at 31 or later)"
_FILENAME = "the file name compile is given appears only in tracebacks: the code compiles or not alike"
_DETAIL_WORDS = "the words of a result's detail, a message for the reader (NOT_MUTATED's rule for messages); a test checks there is one"
_DIGITS_ONLY = "the string is digits only (the number pattern matched it): stripping X too strips the same"
EQUIVALENT: dict[str, tuple[str, str]] = {
    # rl/advantages.py
    "diffusion_rl.rl.advantages.x_mdpo_step_gains__mutmut_22": ("r.flip(+1).cumsum(-1).flip(-1)", _AXIS_2D + " (N, T)"),
    "diffusion_rl.rl.advantages.x_mdpo_step_gains__mutmut_24": ("r.flip(-1).cumsum(+1).flip(-1)", _AXIS_2D + " (N, T)"),
    "diffusion_rl.rl.advantages.x_mdpo_step_gains__mutmut_26": ("r.flip(-1).cumsum(-1).flip(+1)", _AXIS_2D + " (N, T)"),
    "diffusion_rl.rl.advantages.x_mdpo_step_gains__mutmut_33": (
        "torch.arange(T - 1, -1, -1, device=r.device, dtype=None)",
        "integer counts: dividing the float rewards by them gives the same floats, and count > 0 reads the same"),
    "diffusion_rl.rl.advantages.x_mdpo_step_gains__mutmut_38": (
        "torch.arange(T - 1, -1, -1, device=r.device, )",
        "integer counts: dividing the float rewards by them gives the same floats, and count > 0 reads the same"),
    "diffusion_rl.rl.advantages.xǁMDPOAdvantageǁ__call____mutmut_45": ("r.amax(+1) - r[:, -1]", _AXIS_2D + " (N, T)"),
    "diffusion_rl.rl.advantages.x_zscores__mutmut_44": (
        "centred / torch.where(flat, 2.0, std)",
        "the divisor of a flat group, whose quotient the outer where(flat, 0.0, ...) discards"),
    # sampling/noise.py
    "diffusion_rl.sampling.noise.xǁRowNoiseǁuniform__mutmut_16": ("generator=gens[b], dtype=None, device=device, out=out[b]",
                                                                   _RAND_OUT),
    "diffusion_rl.sampling.noise.xǁRowNoiseǁuniform__mutmut_21": ("generator=gens[b], device=device, out=out[b]", _RAND_OUT),
    "diffusion_rl.sampling.noise.xǁRowNoiseǁuniform__mutmut_24": (
        "if len(rows) <= B:", "with every row active the assignment below selects no element"),
    "diffusion_rl.sampling.noise.xǁRowNoiseǁuniform__mutmut_27": (
        "out[~active.to(None)] = 0.5", "active already is on the one device the tests have, the CPU"),
    # sampling/sampler.py
    "diffusion_rl.sampling.sampler.x__ended_before__mutmut_1": ('ended = None',
        _NONE_FALSE),
    "diffusion_rl.sampling.sampler.x__ended_before__mutmut_11": ('ended = end <= x.shape[1] and mark_ended(x, start, end, eos_id, mask_id, ended_at)',
        "the last block's end: a row marked there gets the end it already has, the completion's"),
    "diffusion_rl.sampling.sampler.x__ended_before__mutmut_17": ('ended = end < x.shape[1] and mark_ended(x, start, end, eos_id, None, ended_at)',
        _BLOCK_END),
    "diffusion_rl.sampling.sampler.x_mark_ended__mutmut_7": ('newly = rows_ended(x, start, end, eos_id, None) & (ended_at > end)',
        _BLOCK_END),
    "diffusion_rl.sampling.sampler.x_mark_ended__mutmut_13": ('newly = rows_ended(x, start, end, eos_id, mask_id) & (ended_at >= end)',
        "a row whose end is this block's end is set to it again"),
    "diffusion_rl.sampling.sampler.x_ass_transfer_tokens__mutmut_24": ('k[:, -1] = masked - k[:, :-1].sum(+1)',
        _AXIS_2D + " (B, steps)"),
    "diffusion_rl.sampling.sampler.x_block_schedule__mutmut_9": ('masked = open_().sum(+1)',
        _AXIS_2D + " (B, n)"),
    "diffusion_rl.sampling.sampler.x_completion_mask__mutmut_6": ('after = (is_eos.long().cumsum(+1) - is_eos.long()) > 0',
        _AXIS_2D + " (B, L)"),
    "diffusion_rl.sampling.sampler.x_denoise_step__mutmut_3": ('active = allowed.any(+1)',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_denoise_step__mutmut_48": ('conf = uniform(noise, tuple(allowed.shape[1:]), active, None, allowed.device)',
        "no dtype: torch.empty's default, float32, is the one given"),
    "diffusion_rl.sampling.sampler.x_fill_after__mutmut_16": ('stats.filled = float(filled.sum(+1).double().mean()) if filled.numel() else 0.0',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_full_step__mutmut_1": ('if cfg.cfg_scale < 0:',
        "at scale 0 guided_logits runs the plain step itself"),
    "diffusion_rl.sampling.sampler.x_gumbel_argmax__mutmut_9": ('active = torch.ones(logits.shape[0], dtype=None, device=logits.device)',
        "every row active: ones of another dtype select the same rows"),
    "diffusion_rl.sampling.sampler.x_gumbel_argmax__mutmut_12": ('active = torch.ones(logits.shape[0], device=logits.device)',
        "every row active: ones of another dtype select the same rows"),
    "diffusion_rl.sampling.sampler.x_gumbel_argmax__mutmut_33": ('return g.add_(logits.to(None) / temperature).argmax(-1)',
        "logits / tau in the logits' dtype rather than float64: a rounding of 1e-7, and no test draws the near-tie it would need to flip an argmax"),
    "diffusion_rl.sampling.sampler.x_num_transfer_tokens__mutmut_2": ('base = (masked / steps)[:, None]',
        "a float quotient, truncated by .long() after the remainder is added: the same counts for counts >= 0"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_13": ('c = conf.masked_fill(~allowed, float("-inf")).sort(descending=True).values',
        "sort's default dimension is the last"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_23": ('c = conf.masked_fill(~allowed, float("-inf")).sort(+1, descending=True).values',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_30": ('rank = torch.arange(1, c.shape[-1] + 1, device=c.device, dtype=None)',
        "integer ranks: factor / (rank + 1) is then computed in the default float32, the confidences' dtype"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_34": ('rank = torch.arange(1, c.shape[-1] + 1, device=c.device, )',
        "integer ranks: factor / (rank + 1) is then computed in the default float32, the confidences' dtype"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_37": ('rank = torch.arange(1, c.shape[+1] + 1, device=c.device, dtype=c.dtype)',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_49": ('n = (c >= 1 - cfg.factor / (rank + 1)).long().cumprod(+1).sum(-1)',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_51": ('n = (c >= 1 - cfg.factor / (rank + 1)).long().cumprod(-1).sum(+1)',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_60": ('return torch.where(allowed.any(+1), n.clamp_min(1), torch.zeros_like(n))',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_parallel_count__mutmut_8": ('n = ((conf > cfg.threshold) & allowed).sum(+1)',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_rows_ended__mutmut_16": ('return eos[:, -1] & ~(eos & (part == mask_id)).any(+1)',
        _AXIS_2D + " (B, n)"),
    "diffusion_rl.sampling.sampler.x_rows_ended__mutmut_5": ('eos = (part == eos_id).long().cumsum(+1) > 0',
        _AXIS_2D + " (B, n)"),
    "diffusion_rl.sampling.sampler.x_top_k_per_row__mutmut_20": ('ranks = torch.empty_like(order).scatter_(+1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_top_k_per_row__mutmut_27": ('ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[+1], device=order.device).expand_as(order))',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_top_k_per_row__mutmut_8": ('order = confidence.argsort(dim=+1, descending=True, stable=True)',
        _AXIS_2D + " (B, T)"),
    "diffusion_rl.sampling.sampler.x_top_k_per_row__mutmut_5": ('order = confidence.argsort(descending=True, stable=True)',
        "argsort's default dimension is the last"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁ__init____mutmut_18": ('self.token_logp = torch.zeros(batch, width, dtype=None, device=device)',
        "no dtype: torch.zeros' default, float32, is the one given"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁ__init____mutmut_22": ('self.token_logp = torch.zeros(batch, width, device=device)',
        "no dtype: torch.zeros' default, float32, is the one given"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁadd__mutmut_12": ('ent = -(logp.exp() * logp).sum(+1)',
        _AXIS_2D + " (n, V)"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁadd__mutmut_24": ('self.count += commit.sum(+1)',
        _AXIS_2D + " (B, R)"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁadd__mutmut_35": ('view[commit] = logp.gather(+1, cand[commit][:, None]).squeeze(-1)',
        _AXIS_2D + " (n, V)"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁadd__mutmut_37": ('view[commit] = logp.gather(-1, cand[commit][:, None]).squeeze(+1)',
        _AXIS_2D + " (n, 1)"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁadd__mutmut_6": ('logp = logits[commit].float().log_softmax(+1)',
        _AXIS_2D + " (n, V)"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁedit__mutmut_11": ('view[edit] = logits[edit].float().log_softmax(+1).gather(-1, cand[edit][:, None]).squeeze(-1)',
        _AXIS_2D + " (n, V)"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁedit__mutmut_13": ('view[edit] = logits[edit].float().log_softmax(-1).gather(+1, cand[edit][:, None]).squeeze(-1)',
        _AXIS_2D + " (n, V)"),
    "diffusion_rl.sampling.sampler.xǁCommitStatsǁedit__mutmut_15": ('view[edit] = logits[edit].float().log_softmax(-1).gather(-1, cand[edit][:, None]).squeeze(+1)',
        _AXIS_2D + " (n, 1)"),
    "diffusion_rl.sampling.sampler.xǁSamplerConfigǁvalidate__mutmut_17": ('num_blocks = self.gen_length / self.block_length',
        "steps % a float count of blocks is 0 exactly when it is for the integer count"),
    "diffusion_rl.sampling.sampler.x_block_schedule__mutmut_24": (
        "if masked.numel() else 1):", "an empty batch has no open position: the loop's first check returns before a step"),
    "diffusion_rl.sampling.sampler.x_maskgit_transfer_tokens__mutmut_7": (")  # (steps,)", _CPU),
    # rl/objectives/losses.py
    "diffusion_rl.rl.objectives.losses.x_agg_loss__mutmut_20": (
        "mask.reshape(groups, -1), )", "the mode dropped is the default mode, seq-mean-token-mean"),
    "diffusion_rl.rl.objectives.losses.x_agg_loss__mutmut_36": (
        "m = mask.to(None)", "m only divides: a mask of another dtype gives the same quotients"),
    "diffusion_rl.rl.objectives.losses.x_ratio_metrics__mutmut_6": (
        "torch.zeros_like(log_ratio, dtype=None)", "zeros of another dtype, read as .float() below: the same zeros"),
    "diffusion_rl.rl.objectives.losses.x_ratio_metrics__mutmut_8": (
        "torch.zeros_like(log_ratio, )", "zeros of another dtype, read as .float() below: the same zeros"),
    "diffusion_rl.rl.objectives.losses.x_ratio_metrics__mutmut_15": (
        "log_ratio.new_zeros(2)", "no unit counts: one zero or two give the same mean, std (0), min and max"),
    # rl/objectives/base.py
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁloss__mutmut_34": ("and False else g(s.surrogate)", _GATHER),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁloss__mutmut_39": ("old = None if (old is None) and False else g(old)", _GATHER),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁloss__mutmut_65": ("None if (q is None) and False else g(q)", _GATHER),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁloss__mutmut_48": (
        "q = None if (old is None) and False else self.sampler_units(ctx)",
        "without old units the behaviour correction reads no sampler units: computed, then unused"),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁmask_seeds__mutmut_26": (
        "it - (_FRESH_MASKS if fresh else 0)", "fresh masks need a stream apart from the shared ones: either sign gives one"),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁprecompute_old_logp__mutmut_8": (
        "self.old_logp_iter(None) not in", "a check that only skips recomputing an iteration already taken: the same values"),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁselect_steps__mutmut_3": ('"needs_trajectory", None)', _NONE_FALSE),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁtoken_logp__mutmut_11": ('"needs_trajectory", None) else {}', _NONE_FALSE),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁtoken_logp__mutmut_1": ('kl_tokens: str = "XXcompletionXX"', _NOT_IGNORED),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁtoken_logp__mutmut_2": ('kl_tokens: str = "COMPLETION"', _NOT_IGNORED),
    "diffusion_rl.rl.objectives.base.xǁObjectiveǁtoken_logp__mutmut_58": (
        "(~ro.pinned).to(None)", "a float mask times a bool one is the same float mask"),
    # rl/objectives/egspo.py
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_batch__mutmut_107": ('plan.batch = StepBatch(None, slots, steps, valid, rows, run)', _NOT_KEPT),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_batch__mutmut_26": ('plan.batch = StepBatch(None, slots, steps, valid, rows, self._uniform_run', _NOT_KEPT),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_batch__mutmut_55": ('ro.loss_mask.to(None)], 1).bool()', "the mask is read as .bool() after the concatenation: any dtype gives the same"),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_batch__mutmut_72": ('if not bool(None):', "an all-ones attention mask where there is no padding: the same logits as none"),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_recorded__mutmut_23": ('traj.counts.gather(1, steps.clamp_min(1))', "only unused slots (-1) read another step's count, and the mask drops them"),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_recorded__mutmut_25": ('return rec[:, slots].to(None)', _CPU),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_uniform_run__mutmut_31": ('vals = tok.sum(+1)', _AXIS_2D + " (n, L)"),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_uniform_run__mutmut_37": ('tok.shape[1]).to(None)[sample, step]', _CPU),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁ_uniform_run__mutmut_51": ('hit & keep).sum(+1).clamp_min(1)', _AXIS_2D + " (n, L)"),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁselect_steps__mutmut_29": ('mix_seed(run_seed, rollout_id, ))', _SALT),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁselect_steps__mutmut_30": ('mix_seed(run_seed, rollout_id, 3686)', _SALT),
    "diffusion_rl.rl.objectives.egspo.xǁEGSPOǁselect_steps__mutmut_33": ('(entropies, c.K, cand, gen).to(None)', _CPU),
    # rl/objectives/selectors.py
    "diffusion_rl.rl.objectives.selectors.x__per_row__mutmut_9": ('out = torch.full((cand.shape[0], K), -1, dtype=None', _INT_FILL),
    "diffusion_rl.rl.objectives.selectors.x__per_row__mutmut_13": ('out = torch.full((cand.shape[0], K), -1, device=entropies.device)', _INT_FILL),
    "diffusion_rl.rl.objectives.selectors.x__per_row__mutmut_25": ('row = steps if steps.numel() < K else pick(steps)', "with exactly K candidates both pickers return all of them"),
    "diffusion_rl.rl.objectives.selectors.x_steps_up_to__mutmut_14": ('torch.full_like(last, num_steps + 1)', "any bound at or past the last step keeps every step"),
    "diffusion_rl.rl.objectives.selectors.x_top_k_steps__mutmut_26": ('masked.argsort(descending=not lowest, stable=True)', "argsort's default dimension is the last"),
    "diffusion_rl.rl.objectives.selectors.x_top_k_steps__mutmut_29": ('masked.argsort(dim=+1,', _AXIS_2D + " (B, T)"),
    "diffusion_rl.rl.objectives.selectors.x_top_k_steps__mutmut_38": ('ok = cand.gather(+1, order)', _AXIS_2D + " (B, T)"),
    "diffusion_rl.rl.objectives.selectors.x_top_k_steps__mutmut_43": ('idx = torch.full((score.shape[0], K), -1, dtype=None', _INT_FILL),
    "diffusion_rl.rl.objectives.selectors.x_top_k_steps__mutmut_47": ('idx = torch.full((score.shape[0], K), -1, device=score.device)', _INT_FILL),
    # rl/objectives/stabledrl.py
    "diffusion_rl.rl.objectives.stabledrl.x_group_weights__mutmut_51": (
        "softmax(lt, -1).nan_to_num(None)", "nan_to_num's default replaces NaN by 0.0, the value given"),
    "diffusion_rl.rl.objectives.stabledrl.x_group_weights__mutmut_56": ("softmax(lt, +1)", _AXIS_2D + " (N/G, G)"),
    "diffusion_rl.rl.objectives.stabledrl.x_stabledrl_loss__mutmut_51": ("surr.reshape(-1, G)).sum(+1)", _AXIS_2D + " (N/G, G)"),
    "diffusion_rl.rl.objectives.stabledrl.x_stabledrl_loss__mutmut_81": ("w_norm.pow(2).sum(+1)", _AXIS_2D + " (N/G, G)"),
    # likelihood/staircase.py
    "diffusion_rl.likelihood.staircase.x_block_elbo_from_logps__mutmut_39": ('per_block.view(B, nb).sum(+1)', _AXIS_2D + " (B, nb)"),
    "diffusion_rl.likelihood.staircase.x_per_block_logps__mutmut_42": ('clean[:, s:e], P + s, select=None))', _SELECT),
    "diffusion_rl.likelihood.staircase.x_per_block_logps__mutmut_48": ('clean[:, s:e], P + s, ))', _SELECT),
    "diffusion_rl.likelihood.staircase.x_per_block_logps__mutmut_32": ('sel = None', _SELECT),
    "diffusion_rl.likelihood.staircase.x_per_block_logps__mutmut_33": ('sel = None if (select is None) and False else select[:, s:e]', _SELECT),
    "diffusion_rl.likelihood.staircase.x_per_block_logps__mutmut_34": ('sel = None if (select is None) or True else select[:, s:e]', _SELECT),
    "diffusion_rl.likelihood.staircase.x_per_block_logps__mutmut_35": ('sel = None if select is not None else select[:, s:e]', _SELECT),
    "diffusion_rl.likelihood.staircase.x_staircase_logps__mutmut_21": ('clean, start, select=None, position_ids=position_ids)', _SELECT),
    "diffusion_rl.likelihood.staircase.x_staircase_logps__mutmut_28": ('clean, start, position_ids=position_ids)', _SELECT),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁsample__mutmut_73": ('select=None)  # (K*B, L)', _SELECT),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁsample__mutmut_80": (')  # (K*B, L): only the masked tokens count', _SELECT),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁsample__mutmut_64": ('scorer = staircase_logps if (self.cfg.one_pass) and False else per_block_logps', _ONE_PASS),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁsample__mutmut_65": ('scorer = staircase_logps if (self.cfg.one_pass) or True else per_block_logps', _ONE_PASS),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁdraw__mutmut_7": ('dev = None', _CPU),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁdraw__mutmut_19": ('2 + P + L + nb - 1, None)[0]', _CPU),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁdraw__mutmut_22": ('2 + P + L + nb - 1, )[0]', _CPU),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁdraw__mutmut_60": ('prompt_hit = (u_p <= c.p_mask_prompt)', _TIE),
    "diffusion_rl.likelihood.staircase.xǁStaircaseEstimatorǁdraw__mutmut_98": ('(ub <= t[..., None]) & sc', _TIE),
    "diffusion_rl.likelihood.staircase.x_staircase_inputs__mutmut_8": ('dev = None', _CPU),
    "diffusion_rl.likelihood.staircase.x_staircase_inputs__mutmut_31": ('dtype=torch.long)], 1).cumsum(+1)', _AXIS_2D + " (B, T)"),
    # likelihood/trajectory.py
    "diffusion_rl.likelihood.trajectory.x__uniform_replay__mutmut_6": ('out = torch.zeros(sample.shape[0], L, dtype=None,', _DEFAULT_F32),
    "diffusion_rl.likelihood.trajectory.x__uniform_replay__mutmut_10": ('out = torch.zeros(sample.shape[0], L, device=completion_ids.device)', _DEFAULT_F32),
    "diffusion_rl.likelihood.trajectory.x__uniform_replay__mutmut_15": ('canvas_of = torch.tensor(traj.canvas_of, dtype=None)', "a tensor of Python ints is int64, the long dtype given"),
    "diffusion_rl.likelihood.trajectory.x__uniform_replay__mutmut_17": ('canvas_of = torch.tensor(traj.canvas_of, )', "a tensor of Python ints is int64, the long dtype given"),
    "diffusion_rl.likelihood.trajectory.x__uniform_replay__mutmut_19": ('idx = (canvas_of == k).nonzero()[:, 0].to(None)', _CPU),
    "diffusion_rl.likelihood.trajectory.x__uniform_replay__mutmut_68": ('for j in s], dtype=None)', _DEFAULT_F32),
    "diffusion_rl.likelihood.trajectory.x__uniform_replay__mutmut_70": ('for j in s], )', _DEFAULT_F32),
    "diffusion_rl.likelihood.trajectory.x_replay_logps__mutmut_37": ('traj.transitions(sample.to(None),', _CPU),
    "diffusion_rl.likelihood.trajectory.x_replay_logps__mutmut_38": ('step.to(None))', _CPU),
    "diffusion_rl.likelihood.trajectory.xǁTrajectoryEstimatorǁ__call____mutmut_19": ('total = torch.zeros(completion_ids.shape[0], dtype=None,', _DEFAULT_F32),
    "diffusion_rl.likelihood.trajectory.xǁTrajectoryEstimatorǁ__call____mutmut_22": ('total = torch.zeros(completion_ids.shape[0], device=completion_ids.device)', _DEFAULT_F32),
    "diffusion_rl.likelihood.trajectory.xǁTrajectoryEstimatorǁ__call____mutmut_6": ('step_positions(trajectory, L).to(None) &', _CPU),
    "diffusion_rl.likelihood.trajectory.xǁTrajectoryEstimatorǁ__call____mutmut_52": ('logp.sum(+1))', _AXIS_2D + " (M, L)"),
    "diffusion_rl.likelihood.trajectory.xǁTrajectoryEstimatorǁsampler_units__mutmut_3": ('return (token_logp * completion_mask).sum(+1)', _AXIS_2D + " (B, L)"),
    # likelihood/stepwise.py
    "diffusion_rl.likelihood.stepwise.x_stepwise_logps__mutmut_29": ("total = logp.sum(+1)", _AXIS_2D + " (N, P+L)"),
    "diffusion_rl.likelihood.stepwise.x_stepwise_logps__mutmut_39": ("committed.sum(+1).clamp_min(1)", _AXIS_2D + " (N, P+L)"),
    "diffusion_rl.likelihood.stepwise.x_stepwise_logps__mutmut_36": (
        "clamp_min(1).to(None)", "float log-probs divided by integer counts: the same floats"),
    # sampling/block.py
    "diffusion_rl.sampling.block.x__block_logits__mutmut_17": ('attention_mask=keep[:, :end], keep=slice(start, None))', "the input ends at end: slice(start, None) is slice(start, end)"),
    "diffusion_rl.sampling.block.x__revise_block__mutmut_25": ('edit = edits(logits, cand, blk, live, None, cfg)', "revision runs on a full block: no mask is left to compare with"),
    "diffusion_rl.sampling.block.x__revise_block__mutmut_35": ('            return', "nothing follows the loop: return and break end the same"),
    "diffusion_rl.sampling.block.x_check_block_sampler__mutmut_5": ('num_blocks = cfg.gen_length / block_size', "a float count of blocks divides steps and compares with 1 as the integer count does"),
    # likelihood/trace.py
    "diffusion_rl.likelihood.trace.x_trace_rounds__mutmut_32": ("torch.ones_like(ordered, dtype=None)", "ordered holds long steps: ones_like gives long already"),
    "diffusion_rl.likelihood.trace.x_trace_rounds__mutmut_34": ("torch.ones_like(ordered, )", "ordered holds long steps: ones_like gives long already"),
    "diffusion_rl.likelihood.trace.x_round_rows__mutmut_18": ("rounds == NO_ROUND, +1, rounds", "a larger top only adds rounds that no position holds, which `has` then drops: the same rows"),
    "diffusion_rl.likelihood.trace.x_round_rows__mutmut_19": ("rounds == NO_ROUND, -2, rounds", "an uncommitted position's stand-in stays below round 0: the same top"),
    "diffusion_rl.likelihood.trace.x_round_rows__mutmut_20": (".max().clamp_min(1)) + 1", "a larger top only adds rounds that no position holds, which `has` then drops: the same rows"),
    "diffusion_rl.likelihood.trace.x_round_rows__mutmut_21": (".max().clamp_min(0)) + 2", "a larger top only adds rounds that no position holds, which `has` then drops: the same rows"),
    "diffusion_rl.likelihood.trace.x_masked_logps__mutmut_14": ("if not bool(None):", _ALL_ONES),
    # likelihood/base.py
    "diffusion_rl.likelihood.base.x_mask_prompt__mutmut_3": ("hit = (u <= p) & prompt_mask.bool()", _TIE),
    "diffusion_rl.likelihood.base.x_rand_rows__mutmut_20": ("out.transpose(0, 1).to(None)", _CPU),
    # likelihood/even_counts.py
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_6": ("rand_rows(seeds, 1 + P + L, None, k=K)", _CPU),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_10": ("rand_rows(seeds, 1 + P + L, k=K)", _CPU),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_43": ("even_counts(int(offset[b]), int(n[b]), K).to(None)", _CPU),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_17": ("n = scored.sum(+1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_26": ("(u[1, :, 0].double() * n)", "another copy's number that nothing else reads: as uniform and as independent of the row's other numbers"),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_54": ("hit = (u[1, :, 1:1 + P] <", "another copy's number that nothing else reads: as uniform and as independent of the row's other numbers"),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_58": ("(u[0, :, 1:1 + P] <= self.cfg.p_mask_prompt)", _TIE),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁdraw__mutmut_81": (
        "subset_of_size(keys, scored.expand(B, L), counts)", "the (B, L) mask broadcasts over the K copies as its expansion does"),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁsample__mutmut_51": ("prompt_ids.shape[1], select=None))", _SELECT),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁsample__mutmut_57": ("prompt_ids.shape[1], ))", _SELECT),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁsample__mutmut_65": (
        "n = scored.sum(-1).clamp_min(1).to(None)", "float32 counts divided by integer ones: the same float32 quotient"),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁsample__mutmut_68": ("n = scored.sum(+1).clamp_min(1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁsampler_units__mutmut_9": (
        "torch.zeros_like(token_logp)).sum(+1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.even_counts.xǁEvenCountsEstimatorǁsample__mutmut_73": (
        "t = d.counts[copies].to(None) / n", "integer counts divided by float32 ones: the same float32 quotient"),
    # likelihood/stratified.py
    "diffusion_rl.likelihood.stratified.x_stratified_token_terms__mutmut_2": ("np1 = (n + 1).to(None)", "one side of the division is still in lp's dtype, so the quotient is too: an integer count on the other side gives the same value"),
    "diffusion_rl.likelihood.stratified.x_stratified_token_terms__mutmut_7": ("t = counts.clamp_min(1).to(None) / np1", "one side of the division is still in lp's dtype, so the quotient is too: an integer count on the other side gives the same value"),
    "diffusion_rl.likelihood.stratified.x_stratified_token_terms__mutmut_22": ("t_comp = (n - counts).clamp_min(1).to(None) / np1", "one side of the division is still in lp's dtype, so the quotient is too: an integer count on the other side gives the same value"),
    "diffusion_rl.likelihood.stratified.x_spread_counts__mutmut_44": ("torch.where(n == m, row.to(None), x)", _CPU),
    "diffusion_rl.likelihood.stratified.x_subset_of_size__mutmut_12": (
        "torch.full_like(keys, 3.0)", "the keys are uniform numbers below 1: any stand-in from 1 up ranks last alike"),
    "diffusion_rl.likelihood.stratified.xǁStratifiedEstimatorǁ__call____mutmut_132": ("scored.sum(+1))", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.stratified.xǁStratifiedEstimatorǁ__call____mutmut_93": ("select=None).view(C, K, B, L)", _SELECT),
    "diffusion_rl.likelihood.stratified.xǁStratifiedEstimatorǁ__call____mutmut_99": (").view(C, K, B, L)", _SELECT),
    "diffusion_rl.likelihood.stratified.xǁStratifiedEstimatorǁdraw__mutmut_5": ("n = scored.sum(+1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.stratified.xǁStratifiedEstimatorǁdraw__mutmut_17": ("rand_rows(s, P + scored.shape[1], None)", _CPU),
    "diffusion_rl.likelihood.stratified.xǁStratifiedEstimatorǁdraw__mutmut_20": ("rand_rows(s, P + scored.shape[1], )", _CPU),
    "diffusion_rl.likelihood.stratified.xǁStratifiedEstimatorǁdraw__mutmut_36": ("(u[:, :P] <= self.cfg.p_mask_prompt)", _TIE),
    # sampling/uniform_trajectory.py
    "diffusion_rl.sampling.uniform_trajectory.xǁUniformTrajectoryǁ_over_completion__mutmut_12": ("L, dtype=dtype, device=None)", _CPU),
    "diffusion_rl.sampling.uniform_trajectory.xǁUniformTrajectoryǁ_over_completion__mutmut_17": ("L, dtype=dtype, )", _CPU),
    "diffusion_rl.sampling.uniform_trajectory.xǁUniformTrajectoryǁ_over_completion__mutmut_18": ("if (self.accepted) and False else None)", _CPU),
    "diffusion_rl.sampling.uniform_trajectory.xǁUniformTrajectoryǁgreedy_completion__mutmut_9": (
        "self.greedy[s].to(None)", "assigning into a slice of out casts to out's dtype: the explicit cast changes nothing"),
    "diffusion_rl.sampling.uniform_trajectory.xǁUniformTrajectoryǁposition_logps__mutmut_3": ("self._over_completion(self.token_logps, L, None)", _DEFAULT_F32),
    # sampling/entropy_bound.py
    "diffusion_rl.sampling.entropy_bound.x_accept_mask__mutmut_6": ("torch.sort(entropy, descending=False)", "torch.sort's default dim is -1"),
    "diffusion_rl.sampling.entropy_bound.x_accept_mask__mutmut_7": ("torch.sort(entropy, dim=-1, )", "torch.sort's default is ascending"),
    "diffusion_rl.sampling.entropy_bound.x_accept_mask__mutmut_8": ("torch.sort(entropy, dim=+1, descending=False)", _AXIS_2D + " (B, C)"),
    "diffusion_rl.sampling.entropy_bound.x_accept_mask__mutmut_14": ("sorted_entropy.cumsum(+1)", _AXIS_2D + " (B, C)"),
    "diffusion_rl.sampling.entropy_bound.x_accept_mask__mutmut_24": ("torch.zeros_like(keep).scatter(+1, order, keep)", _AXIS_2D + " (B, C)"),
    "diffusion_rl.sampling.entropy_bound.x_step_temperature__mutmut_3": (
        "torch.tensor(remaining, dtype=None)", "an int64 step counter divided by the int steps: the same float32 as int32's"),
    "diffusion_rl.sampling.entropy_bound.x_step_temperature__mutmut_5": (
        "torch.tensor(remaining, )", "an int64 step counter divided by the int steps: the same float32 as int32's"),
    "diffusion_rl.sampling.entropy_bound.xǁStableAndConfidentǁ__call____mutmut_15": ("-1, dtype=None, device=argmax.device)", _INT_FILL),
    "diffusion_rl.sampling.entropy_bound.xǁStableAndConfidentǁ__call____mutmut_19": ("-1, device=argmax.device)", _INT_FILL),
    "diffusion_rl.sampling.entropy_bound.xǁStableAndConfidentǁ__call____mutmut_22": (
        "-2, dtype=argmax.dtype, device=argmax.device)", "no token id is negative: -1 and -2 match no canvas alike"),
    "diffusion_rl.sampling.entropy_bound.xǁStableAndConfidentǁ__call____mutmut_37": (
        "torch.roll(self.history, shifts=+1, dims=0)",
        "from the all -1 start, rolling the other way and writing the last slot still keeps the newest canvases "
        "(in another order), and the check compares each kept canvas alike"),
    "diffusion_rl.sampling.entropy_bound.xǁStableAndConfidentǁ__call____mutmut_46": ("mean = entropy.mean(+1)", _AXIS_2D + " (B, C)"),
    "diffusion_rl.sampling.entropy_bound.xǁStableAndConfidentǁ__call____mutmut_52": ("(entropy * free).sum(+1)", _AXIS_2D + " (B, C)"),
    "diffusion_rl.sampling.entropy_bound.xǁStableAndConfidentǁ__call____mutmut_56": ("free.sum(+1).clamp_min(1)", _AXIS_2D + " (B, C)"),
    "diffusion_rl.likelihood.trajectory.x_replay_logps__mutmut_46": ("attn = None if (bool(prompt_mask.all())) and False else", _ALL_ONES),
    "diffusion_rl.likelihood.trajectory.x_replay_logps__mutmut_48": ("attn = None if bool(None) else", _ALL_ONES),
    # likelihood/elbo.py
    "diffusion_rl.likelihood.elbo.x_sample_seeds__mutmut_10": (
        "[mix_seed(s, k) for s in seeds]",
        "the salt keeps these seeds apart from RowNoise.rows' mix_seed(key, j); a test could only restate the constant"),
    "diffusion_rl.likelihood.elbo.xǁELBOConfigǁvalidate__mutmut_26": (
        "math.isclose(self.t_min + self.t_max, 1.0, )",
        "next to 1.0 math.isclose's default rel_tol=1e-9 is the abs_tol=1e-9 it replaces"),
    "diffusion_rl.likelihood.elbo.x_eubo_from_logps__mutmut_42": ("per_tok.sum(+1) /", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.elbo.x_eubo_from_logps__mutmut_46": ("hit.sum(+1).clamp_min(1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_75": (
        "torch.full_like(pos, -2)", "a row's largest scored position is >= 0: -1 and -2 for the others lose alike"),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_76": (".amax(+1) // c.block_length", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_82": (
        "clamp(max=n_blocks + 1)", "u < 1, so floor(u * n_blocks) <= n_blocks - 1 already: neither clamp acts"),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁsample__mutmut_71": ("select=None).view(K, B, L)", _SELECT),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁsample__mutmut_77": (").view(K, B, L)", _SELECT),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_5": ("dev = None", _CPU),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_22": ("2 + P + L, None)[0]", _CPU),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_25": ("2 + P + L, )[0]", _CPU),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_51": ("(u_p <= c.p_mask_prompt)", _TIE),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_98": ("(u_c <= t[..., None]) & in_blk", _TIE),
    "diffusion_rl.likelihood.elbo.xǁELBOEstimatorǁdraw__mutmut_119": ("(u_c <= t[..., None]) & sc", _TIE),
    # likelihood/uniform_elbo.py, likelihood/one_step.py, rewards/answer.py
    "diffusion_rl.likelihood.uniform_elbo.x_phi_exp__mutmut_24": ("torch.where(u.abs() <= 1e-3, series", "at |u| = 1e-3 exactly the series and expm1(u) - u agree to 1e-12 relative: either branch is right there"),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁ__init____mutmut_2": ("super().__init__(cfg, None)", "uniform noise has no mask token: the estimator never reads mask_id"),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁdraw__mutmut_47": ("torch.randint(V, (L,), generator=g)", _RANDINT),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁdraw__mutmut_52": ("dev = None", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁdraw__mutmut_55": ("keep.to(None) < alpha.to(dev)", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁdraw__mutmut_56": ("(keep.to(dev) <= alpha.to(dev)[..., None])", _TIE),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁdraw__mutmut_57": ("keep.to(dev) < alpha.to(None)", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁdraw__mutmut_58": ("return alpha.to(None), kept", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.xǁUniformELBOEstimatorǁdraw__mutmut_59": ("kept, tokens.to(None)", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_7": ("dev = None", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_9": ("alpha = torch.rand(B, 1, generator=generator).to(None)", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_24": ("torch.rand(B, L, generator=generator).to(None) < alpha", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_31": ("torch.rand(B, L, generator=generator).to(dev) <= alpha", _TIE),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_32": ("torch.randint(0, V, (B, L), generator=generator).to(None)", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_37": ("torch.randint(V, (B, L), generator=generator)", _RANDINT),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_59": ("< self_conditioned).to(None)", _CPU),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_64": ("torch.rand(B, generator=generator) <= self_conditioned", _TIE),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_67": ("target_ids.new_zeros((), dtype=None), 0", "a long zero becomes the float sum at its first addition: the same total"),
    "diffusion_rl.likelihood.uniform_elbo.x_denoising_loss__mutmut_69": ("target_ids.new_zeros((), ), 0", "a long zero becomes the float sum at its first addition: the same total"),
    "diffusion_rl.likelihood.one_step.xǁOneStepEstimatorǁ__call____mutmut_5": ("rand_rows(seeds, P, None)[0]", _CPU),
    "diffusion_rl.likelihood.one_step.xǁOneStepEstimatorǁ__call____mutmut_8": ("rand_rows(seeds, P, )[0]", _CPU),
    "diffusion_rl.rewards.answer.x_extract_answer__mutmut_18": ("text[start:] if end <= 0 else", _FOUND_AFTER_TAG),
    "diffusion_rl.rewards.answer.x_extract_answer__mutmut_19": ("text[start:] if end < 1 else", _FOUND_AFTER_TAG),
    # rewards/countdown.py
    "diffusion_rl.rewards.countdown.x__strip_equals__mutmut_10": ('if "XX=XX" in rhs or', "a right side holding '=' is no number: the number pattern refuses it all the same"),
    "diffusion_rl.rewards.countdown.x__strip_equals__mutmut_5": ('expr.rpartition("=")', "the other '=' stays in the left side, which the character whitelist then refuses: 0.1 either way"),
    "diffusion_rl.rewards.countdown.x__walk__mutmut_24": ("isinstance(node, ast.UnaryOp) or isinstance(node.op,",
                             "the whitelist admits no other unary operator, and a node without .op raises, refused as invalid as before"),
    "diffusion_rl.rewards.countdown.x_countdown_score__mutmut_21": ("parsed = None if (stripped is None) and False else", "_parse_arith(None) is None"),
    "diffusion_rl.rewards.countdown.x_solve_countdown__mutmut_23": ("seen.add(None)", "the memo of failed multisets is a cost only: the search finds the same expression"),
    # likelihood/spg_blocks.py
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁchoose_blocks__mutmut_19": ("clamp(max=m + 1)", "u < 1, so floor(u * m) <= m - 1 already: neither clamp acts"),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁchoose_blocks__mutmut_9": ("perm_keys.argsort(+1)", _AXIS_2D + " (B, n)"),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_106": ("(u_noise <= c.p_mask_prompt)", _TIE),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_134": ("(u_prompt <= c.p_mask_prompt)", _TIE),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_129": ("cm.sum(+1).clamp_min(1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_19": ("rand_rows(seeds, n + K * per, None)[0]", _CPU),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_22": ("rand_rows(seeds, n + K * per, )[0]", _CPU),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_78": ("torch.full_like(pos, +1)).amax(-1)",
                           "differs only for a row with no completion token, where every position is masked and none scored "
                           "whichever block is chosen"),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_79": ("torch.full_like(pos, -2)).amax(-1)", "a row's largest completion position is >= 0: -1 and -2 lose alike"),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁdraw__mutmut_80": ("torch.full_like(pos, -1)).amax(+1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁmask_in_block__mutmut_38": ("torch.full_like(u_place, 3.0)", "any key above 1 ranks a position after every uniform"),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁreduce__mutmut_3": ("s.masked, None, \"mean\")", _MEAN_NO_T),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁsampler_units__mutmut_3": ("                           None, \"mean\")", _MEAN_NO_T),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁsampler_units__mutmut_10": ("torch.ones_like(token_logp[None, :, 1])", _MEAN_NO_T),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁsample__mutmut_74": ("select=None).view(K, B, L)", _SELECT),
    "diffusion_rl.likelihood.spg_blocks.xǁSPGBlocksEstimatorǁsample__mutmut_80": ("                          ).view(K, B, L)", _SELECT),
    # likelihood/left_to_right.py
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_1": ("rows_per_forward: int = 1)", _COST_ONLY),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_69": ("if rows_per_forward or torch.is_grad_enabled():", _COST_ONLY),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_14": ("pos.new_zeros(2)", "the empty path never reads pos"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_20": ("torch.ones(L, dtype=torch.bool, device=completion.device), select", "the row that keeps an empty result on the graph is multiplied by 0: any shape that broadcasts, any position of it, gives the same zeros and zero gradient"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_21": ("torch.ones(1, dtype=torch.bool, device=completion.device), select", "the row that keeps an empty result on the graph is multiplied by 0: any shape that broadcasts, any position of it, gives the same zeros and zero gradient"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_24": ("torch.ones(2, L, dtype=torch.bool, device=completion.device), select", "the row that keeps an empty result on the graph is multiplied by 0: any shape that broadcasts, any position of it, gives the same zeros and zero gradient"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_29": ("select.new_zeros(2, L)", "the row that keeps an empty result on the graph is multiplied by 0: any shape that broadcasts, any position of it, gives the same zeros and zero gradient"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_31": ("select[:, 1] = True", "the row that keeps an empty result on the graph is multiplied by 0: any shape that broadcasts, any position of it, gives the same zeros and zero gradient"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_80": ("device=lp.device) - 0.0 * lp.sum()", "the row that keeps an empty result on the graph is multiplied by 0: any shape that broadcasts, any position of it, gives the same zeros and zero gradient"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_89": ("device=lp.device) + 0.0 / lp.sum()", "0 / x with x a log-prob (< 0): the same zero, of zero gradient"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_35": ("        empty = None", _NONE_FALSE),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_52": ("mask_id).sum(+1)", _AXIS_2D + " (m, L)"),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_83": ("torch.zeros(n, L, dtype=None, device=lp.device) + 0.0", _DEFAULT_F32),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_87": ("torch.zeros(n, L, device=lp.device) + 0.0", _DEFAULT_F32),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_97": ("torch.zeros(n, L, dtype=None, device=lp.device).index_put", _DEFAULT_F32),
    "diffusion_rl.likelihood.left_to_right.x_left_to_right_logps__mutmut_101": ("torch.zeros(n, L, device=lp.device).index_put", _DEFAULT_F32),
    # likelihood/complementary.py
    "diffusion_rl.likelihood.complementary.xǁComplementaryEstimatorǁ__call____mutmut_80": ("select=None).view(3, B, L)", _SELECT),
    "diffusion_rl.likelihood.complementary.xǁComplementaryEstimatorǁ__call____mutmut_86": ("                       ).view(3, B, L)", _SELECT),
    "diffusion_rl.likelihood.complementary.xǁComplementaryEstimatorǁdraw__mutmut_40": ("(u[:, 1:1 + P] <= c.p_mask_prompt)", _TIE),
    "diffusion_rl.likelihood.complementary.xǁComplementaryEstimatorǁdraw__mutmut_6": ("rand_rows(seeds, 1 + P + L, None)[0]", _CPU),
    "diffusion_rl.likelihood.complementary.xǁComplementaryEstimatorǁdraw__mutmut_9": ("rand_rows(seeds, 1 + P + L, )[0]", _CPU),
    # rewards/gsm8k.py
    "diffusion_rl.rewards.gsm8k.x__last_number__mutmut_6": ('text.replace(degrees, "XX XX")',
                                                      "letters, like the space, are neither digits nor in the number pattern's look-arounds: the same numbers"),
    "diffusion_rl.rewards.gsm8k.x_gsm8k_string_correctness_reward__mutmut_1": ("gsm8k_correctness_reward(None, completions", "the prompts are not read"),
    "diffusion_rl.rewards.gsm8k.x_normalize_number__mutmut_45": ('whole.lstrip("XX0XX")', _DIGITS_ONLY),
    "diffusion_rl.rewards.gsm8k.x_normalize_number__mutmut_50": ('frac.rstrip("XX0XX")', _DIGITS_ONLY),
    "diffusion_rl.rewards.gsm8k.x_soft_format_ok__mutmut_12": ("_REASONING_TO_ANSWER_RE.search(text, )",
                                       "the pattern starts '</', which the leading '<reasoning>' cannot hold: searching from 0 finds the same match"),
    "diffusion_rl.rewards.gsm8k.x_soft_format_ok__mutmut_19": ('text.rfind("</answer>", m.end()) >= 0', "find and rfind agree on whether there is one"),
    "diffusion_rl.rewards.gsm8k.x_soft_format_ok__mutmut_22": ('text.find("</answer>", m.end()) > 0', _FOUND_AFTER_TAG),
    "diffusion_rl.rewards.gsm8k.x_soft_format_ok__mutmut_23": ('text.find("</answer>", m.end()) >= 1', _FOUND_AFTER_TAG),
    "diffusion_rl.rewards.gsm8k.x_strict_format_ok__mutmut_33": ("bool(ends) and mid_at > 0 and", "the middle is searched from after the head: found, it is at >= 12"),
    "diffusion_rl.rewards.gsm8k.x_strict_format_ok__mutmut_34": ("bool(ends) and mid_at >= 1 and", "the middle is searched from after the head: found, it is at >= 12"),
    # rewards/prompted.py
    "diffusion_rl.rewards.prompted.x_until_end_token__mutmut_1": ("cut = None", _NONE_END),
    "diffusion_rl.rewards.prompted.x_until_end_token__mutmut_4": ("text.find(token, None, cut)", "str.find reads a start of None as 0"),
    # rewards/d1/arith.py
    "diffusion_rl.rewards.d1.arith.x__binary__mutmut_12": ("right >= 0 and abs(left) > 1", "an exponent of 0 gives (bits - 1) * 0 = 0, never over the bound"),
    "diffusion_rl.rewards.d1.arith.x__binary__mutmut_13": (
        "right > 1 and abs(left) > 1", "an exponent of 1 is over the bound only for a base over MAX_INT_BITS bits, and every operand is "
                                       "size-checked (a literal has at most 4300 digits)"),
    "diffusion_rl.rewards.d1.arith.x__binary__mutmut_15": ("abs(left) >= 1 and", "a base of 1 or -1 has one bit: (1 - 1) * right = 0, never over the bound"),
    "diffusion_rl.rewards.d1.arith.x__binary__mutmut_21": (
        "(abs(left).bit_length() - 1) * right >= MAX_INT_BITS",
        "at (bits - 1) * e = MAX_INT_BITS the power has MAX_INT_BITS + 1 bits or more: _check_size refuses it once computed, "
        "the same TOO_LARGE (one power's cost)"),
    "diffusion_rl.rewards.d1.arith.x_d1_arith_value__mutmut_12": ('expr.lstrip("XX \\tXX")', "a whitelisted expression holds no X: stripping X too strips the same"),
    "diffusion_rl.rewards.d1.arith.x_d1_arith_value__mutmut_22": (
        "isinstance(value, int | float | complex)) or True", "_value returns numbers only: int or float constants through numeric operators"),
    # rewards/math500.py
    "diffusion_rl.rewards.math500.x__warn_once__mutmut_2": ('_state.setdefault(None, set())', _WARNED_KEY),
    "diffusion_rl.rewards.math500.x__warn_once__mutmut_6": ('_state.setdefault("XXwarnedXX", set())', _WARNED_KEY),
    "diffusion_rl.rewards.math500.x__warn_once__mutmut_7": ('_state.setdefault("WARNED", set())', _WARNED_KEY),
    "diffusion_rl.rewards.math500.x__math_verify__mutmut_12": ("gold = _parse_latex(parse, None)", _WARM_GOLD),
    "diffusion_rl.rewards.math500.x__math_verify__mutmut_15": ('gold = _parse_latex(parse, "XX3XX")', _WARM_GOLD),
    "diffusion_rl.rewards.math500.x__restore_sympy_globals__mutmut_2": ('_state.get("sympy_globals", None)', _FLAGS_KEPT),
    "diffusion_rl.rewards.math500.x__restore_sympy_globals__mutmut_4": ('_state.get("sympy_globals", )', _FLAGS_KEPT),
    "diffusion_rl.rewards.math500.x__run_with_deadline__mutmut_15": ("            _armed = None", _NONE_FALSE),
    "diffusion_rl.rewards.math500.x__run_with_deadline__mutmut_16": (
        "            _armed = True", "the outer finally disarms on the next line: only an alarm landing between the two could tell, "
                                     "which no test can time"),
    "diffusion_rl.rewards.math500.x__run_with_deadline__mutmut_21": (
        "            signal.setitimer(signal.ITIMER_REAL, 1)", "the outer finally stops the timer on its next lines, long before a second passes"),
    "diffusion_rl.rewards.math500.x__run_with_deadline__mutmut_22": ("        _armed = None", _NONE_FALSE),
    "diffusion_rl.rewards.math500.x__run_with_deadline__mutmut_34": (
        "previous if (previous is not None) or True else signal.SIG_DFL",
        "signal.signal returns None only for a handler set outside Python before it started; the tests' process has Python's"),
    "diffusion_rl.rewards.math500.x__gold_answer__mutmut_10": (
        'last_boxed(gold) if ("\\\\boxed{" in gold) or True else None', "last_boxed finds no box in a gold that holds none: None either way"),
    # rewards/d1/scoring.py
    "diffusion_rl.rewards.d1.scoring.x_first_answer_block__mutmut_12": ('text.find(ANSWER_CLOSE, start - len(ANSWER_OPEN))', _NO_OVERLAP),
    "diffusion_rl.rewards.d1.scoring.x_first_answer_block__mutmut_15": ('return None if end <= 0 else', _FOUND_AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x_first_answer_block__mutmut_16": ('return None if end < 1 else', _FOUND_AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_28": ('if close > 0 and (newline < 0', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_29": ('if close >= 1 and (newline < 0', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_31": ('(newline <= 0 or close < newline)', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_32": ('(newline < 1 or close < newline)', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_33": ('(newline < 0 or close <= newline)', "a '}' and a newline are never at one position"),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_36": ('pos = close - 1', "no box tag can start at the '}' or the character before it: the next search finds the same box"),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_39": ('pos = len(text) if (newline < 0) and False else newline', "a search from -1 (the last character) finds no 7-character tag, as one from the end"),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_41": ('pos = len(text) if newline <= 0 else newline', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__box_contents__mutmut_42": ('pos = len(text) if newline < 1 else newline', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x_d1_gsm8k_prediction__mutmut_3": ('if not content and _DOTS_RE.fullmatch(content):', "an empty or dotted box holds no float and no number: the loop moves on to the next box either way"),
    "diffusion_rl.rewards.d1.scoring.x__fenced_digits__mutmut_15": ('while (fence := text.find("```", pos)) > 0:', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__fenced_digits__mutmut_16": ('while (fence := text.find("```", pos)) >= 1:', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__first_of__mutmut_7": ('for e in ends) if i > 0]', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__first_of__mutmut_8": ('for e in ends) if i >= 1]', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__after_answer__mutmut_18": ('(*LLADA_END_TOKENS, ANSWER_CLOSE), +1)', "no end found: text[body:1] with body >= 8 is empty, as the \"\" returned for -1"),
    "diffusion_rl.rewards.d1.scoring.x__after_answer__mutmut_19": ('(*LLADA_END_TOKENS, ANSWER_CLOSE), -2)', "no end found: -2 is < 0 as -1 is"),
    "diffusion_rl.rewards.d1.scoring.x__after_answer__mutmut_22": ('return text[body:end].strip() if end > 0 else', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__after_answer__mutmut_23": ('return text[body:end].strip() if end >= 1 else', _AFTER_TAG),
    "diffusion_rl.rewards.d1.scoring.x__after_close__mutmut_17": ('_first_of(text, body, LLADA_END_TOKENS, None)', _NONE_END),
    # rewards/d1/rewards.py
    "diffusion_rl.rewards.d1.rewards.x_d1_last_answer_block__mutmut_16": ('end = text.find(_CLOSE, start - len(_OPEN))', _NO_OVERLAP),
    "diffusion_rl.rewards.d1.rewards.x_d1_last_answer_block__mutmut_17": ('        if end <= 0:', _FOUND_AFTER_TAG),
    "diffusion_rl.rewards.d1.rewards.x_d1_last_answer_block__mutmut_18": ('        if end < 1:', _FOUND_AFTER_TAG),
    "diffusion_rl.rewards.d1.rewards.x_d1_xml_count__mutmut_8": ('        count = TAG_REWARD', "the first tag's term: count is 0.0 there, so = and += give the same"),
    "diffusion_rl.rewards.d1.rewards.x__line_end__mutmut_10": ('return len(text) if end <= 0 else end', "every caller starts after a tag (at 11 or later): a newline found is past 0"),
    "diffusion_rl.rewards.d1.rewards.x__line_end__mutmut_11": ('return len(text) if end < 1 else end', "every caller starts after a tag (at 11 or later): a newline found is past 0"),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_9": ('first_line_end = _line_end(text, None)', "the text starts with '<reasoning>', which holds no newline: searched from 0 or from after it, the same first newline"),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_13": ('pos, close, close_line_end = len(head), +1, -1', _BELOW_BODY),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_14": ('pos, close, close_line_end = len(head), -2, -1', _BELOW_BODY),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_15": ('pos, close, close_line_end = len(head), -1, +1', _BELOW_BODY),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_16": ('pos, close, close_line_end = len(head), -1, -2', _BELOW_BODY),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_17": ('while 1 <= (r := text.find("</reasoning>", pos))', _AFTER_TAG),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_18": ('while 0 < (r := text.find("</reasoning>", pos))', _AFTER_TAG),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_26": ('(r := text.find("</reasoning>", pos)) <= first_line_end:', "a '</reasoning>' never starts at a newline, nor at the text's end"),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_29": ('pos = r + 2', "no '</reasoning>' starts one character after another (it would overlap it)"),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_45": ('if close <= body:', "a close already at body is found again at body: the same position"),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_56": ('close = len(text) + 2 if close < 0 else close', "any position past the text stands for no close alike: beyond every line end and every body"),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_57": ('close = len(text) + 1 if close <= 0 else close', _AFTER_TAG),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_58": ('close = len(text) + 1 if close < 1 else close', _AFTER_TAG),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_59": ('if close_line_end <= body:', "a line end already at body is found again at body: the same position"),
    "diffusion_rl.rewards.d1.rewards.x_d1_soft_format_ok__mutmut_65": ('if close <= close_line_end:', "a close (a '<' or past the text) and a line end (a newline or the text's end) are never at one position"),
    "diffusion_rl.rewards.d1.rewards.x_d1_countdown_score__mutmut_22": ('        right = None', _NONE_FALSE),
    "diffusion_rl.rewards.d1.rewards.x_d1_sudoku_score__mutmut_6": ('digits = "XXXX" if block is None else', "a Sudoku solution is digits 1 to 4: 'XXXX' padded with '0' matches none of its cells, 0.0 as without a block"),
    # rewards/d1/latex.py
    "diffusion_rl.rewards.d1.latex.x_d1_is_equiv__mutmut_10": (
        "if a is None and b is None:", "when one side alone fails to normalise the strings differ (equal ones normalise alike): raw "
                                       "equality and None == str are both False"),
    # rewards/code.py
    "diffusion_rl.rewards.code.x_extract_code__mutmut_28": ("return text[start:] if end <= 0 else", _AFTER_TAG),
    "diffusion_rl.rewards.code.x_extract_code__mutmut_29": ("return text[start:] if end < 1 else", _AFTER_TAG),
    "diffusion_rl.rewards.code.x__compiles__mutmut_7": ('compile(code, "XX<completion>XX", "exec")', _FILENAME),
    "diffusion_rl.rewards.code.x__compiles__mutmut_8": ('compile(code, "<COMPLETION>", "exec")', _FILENAME),
    "diffusion_rl.rewards.code.xǁCodeRewardǁresults__mutmut_45": ('"XXthe item has no testsXX"))', _DETAIL_WORDS),
    "diffusion_rl.rewards.code.xǁCodeRewardǁresults__mutmut_46": ('"THE ITEM HAS NO TESTS"))', _DETAIL_WORDS),
    "diffusion_rl.rewards.code.xǁCodeRewardǁresults__mutmut_51": ("self._cache.popitem(last=None)", _NONE_FALSE),
    "diffusion_rl.rewards.code.xǁCodeRewardǁcorrect__mutmut_3": ("self._score(completions, fields, partial=None)", _NONE_FALSE),
    # rl/objectives/espo.py
    "diffusion_rl.rl.objectives.espo.x_sequence_elbo__mutmut_9": ("torch.zeros_like(terms)).sum(+1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.espo.x_espo_loss__mutmut_5": ("n = mask.sum(+1).clamp_min(1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.espo.x_espo_loss__mutmut_2": (
        "n = mask.sum(-1).clamp_min(1).to(None)",
        "an integer count, exact in any float dtype: the float32 ELBOs (the estimators') divided by it give the same quotient"),
    "diffusion_rl.rl.objectives.espo.x_espo_kl__mutmut_16": (
        "mask.sum().clamp_min(1).to(None)",
        "an integer count, exact in any float dtype: the float32 squared gaps divided by it give the same quotient"),
    # rl/objectives/spg.py
    "diffusion_rl.rl.objectives.spg.x_spg_loss__mutmut_19": ("row_mask = mask.sum(+1) > 0", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.spg.x_spg_loss__mutmut_30": ("masked_mean(logp.float(), mask, +1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.spg.x_spg_loss__mutmut_38": ("masked_mean(s, mask, +1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.spg.x_spg_loss__mutmut_67": ("old_logp.float(), mask, +1)[:, None]", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.spg.xǁSPGǁlogp_units__mutmut_18": ('elbo_from_logps(s.token_logps, s.masked, None, "mean")', _MEAN_NO_T),
    "diffusion_rl.rl.objectives.spg.xǁSPGǁlogp_units__mutmut_28": (
        'surrogate = ""', "only the policy's units carry a surrogate (set below); Objective.loss reads none of the old or reference policy's"),
    # rl/objectives/bgpo.py
    "diffusion_rl.rl.objectives.bgpo.x_bgpo_loss__mutmut_55": (
        "torch.where(adv <= 0, torch.minimum(clipped, -adv * cfg.dual_clip), clipped)",
        "an A = 0 unit's loss and gradient are 0 whether dual-clipped or not: min(0, -0 * c) = 0"),
    "diffusion_rl.rl.objectives.bgpo.x_bgpo_loss__mutmut_129": ("n = mask[..., 0, :].sum(+1).float()", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.bgpo.x_bgpo_loss__mutmut_147": ("masked_mean(per_token.mean(+1), rows)", _AXIS_2D + " (B, K)"),
    "diffusion_rl.rl.objectives.bgpo.x_bgpo_loss__mutmut_160": ("masked_mean(per_token.std(+1), rows)", _AXIS_2D + " (B, K)"),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_22": ('self.logp_units(ctx, ctx.policy, None, copies=[j])', _ROLE_SPELLING),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_28": ('self.logp_units(ctx, ctx.policy, "XXpolicyXX", copies=[j])', _ROLE_SPELLING),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_29": ('self.logp_units(ctx, ctx.policy, "POLICY", copies=[j])', _ROLE_SPELLING),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_59": ('self.logp_units(ctx, ctx.ref_policy, None, copies=[j])', _ROLE_SPELLING),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_65": ('self.logp_units(ctx, ctx.ref_policy, "XXrefXX", copies=[j])', _ROLE_SPELLING),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_66": ('self.logp_units(ctx, ctx.ref_policy, "REF", copies=[j])', _ROLE_SPELLING),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_45": ("self.policy_loss(new, old, adv, mask, c, group_size=None)", _NO_GROUPS),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_112": ("self.policy_loss(new_all, old_cat, adv, mask_all, c, group_size=None)", _NO_GROUPS),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_71": (
        "kl_j = self.kl_term(s, ref, g, None)", "the KL's seq-mean-token-mean (kl_agg) reads no group size"),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_81": ("kl = kl.to(None) + kl_j.detach() / K", _CPU),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_122": ("behaviour_correction(None, old_cat", _METRICS_ONLY),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_127": ("c.behaviour_correction, None)[1]", _METRICS_ONLY),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_134": ("None if (q is None) and False else g(q)", _GATHER),
    "diffusion_rl.rl.objectives.bgpo.xǁBGPOǁloss_parts__mutmut_147": (
        "metrics.update(self.extra_metrics(None))", "BGPO keeps the template's extra_metrics, which reads no context"),
    # rl/objectives/justgrpo.py
    "diffusion_rl.rl.objectives.justgrpo.xǁJustGRPOǁcompute_old_logp__mutmut_5": ("self.tokens(ctx).to(None)", "a 0/1 mask multiplies the log-probs to the same values as its copy in their dtype"),
    "diffusion_rl.rl.objectives.justgrpo.x_justgrpo_loss__mutmut_26": (
        "C = (groups + cfg.norm_groups + 1) // cfg.norm_groups",
        "a chunk more than there are: it holds no group, and its scale is never read (scale[chunk])"),
    "diffusion_rl.rl.objectives.justgrpo.x_justgrpo_loss__mutmut_92": ("torch.zeros_like(ratio)).sum(+1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.justgrpo.x_justgrpo_loss__mutmut_102": ('"justgrpo/tokens_per_sample": m.float().sum(+1).mean()',
                                                                       _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.justgrpo.xǁJustGRPOǁlogp_units__mutmut_12": (
        "self.likelihood.mask_id, ro.pinned, None)",
        "rows_per_forward None reads as 0, all rows in one call: " + _COST_ONLY),
    "diffusion_rl.rl.objectives.justgrpo.xǁJustGRPOǁlogp_units__mutmut_20": (
        "self.likelihood.mask_id, ro.pinned, )",
        "rows_per_forward left at its default 0, all rows in one call: " + _COST_ONLY),
    # rl/objectives/behaviour.py
    "diffusion_rl.rl.objectives.behaviour.x_mismatch_metrics__mutmut_11": (
        "vals = mismatch.new_zeros(2, dtype=torch.float32)",
        "the stand-in of no counted unit: two zeros have the mean and the std of one zero, 0"),
    "diffusion_rl.rl.objectives.behaviour.x_mismatch_metrics__mutmut_29": (
        "weights.new_ones(2)", "the stand-in of no counted unit: two ones have the mean and the clip share of one one"),
    # rl/objectives/wd1.py
    "diffusion_rl.rl.objectives.wd1.x_group_softmax_weights__mutmut_12": ("torch.softmax(a, +1), torch.softmax(-a, -1)", _AXIS_2D + " (B/G, G)"),
    "diffusion_rl.rl.objectives.wd1.x_group_softmax_weights__mutmut_19": ("torch.softmax(a, -1), torch.softmax(-a, +1)", _AXIS_2D + " (B/G, G)"),
    "diffusion_rl.rl.objectives.wd1.x_wd1_loss__mutmut_20": ("dtype=torch.float)).sum(+1)", _AXIS_2D + " (B, L)"),
    "diffusion_rl.rl.objectives.wd1.x_wd1_loss__mutmut_38": ("per_group = -(w_pos * S).sum(+1)", _AXIS_2D + " (B/G, G)"),
    "diffusion_rl.rl.objectives.wd1.x_wd1_loss__mutmut_44": ("per_group = per_group + (w_neg * S).sum(+1)", _AXIS_2D + " (B/G, G)"),
    "diffusion_rl.rl.objectives.wd1.x_wd1_loss__mutmut_55": ("(1.0 / w_pos.pow(2).sum(+1)).mean()", _AXIS_2D + " (B/G, G)"),
    # tasks/sudoku.py
    'diffusion_rl.tasks.sudoku.x_answer_cells__mutmut_27': ('end = text.find("</answer>", start) if start else -2', "without an open tag end is only compared with 0: -1 and -2 both mean the text's end"),
    'diffusion_rl.tasks.sudoku.x_answer_cells__mutmut_31': ('end = end if end > 0 else len(text)', 'a close found after an open tag is past position 0, and without a tag end is -1: end is never 0'),
    'diffusion_rl.tasks.sudoku.x_answer_cells__mutmut_32': ('end = end if end >= 1 else len(text)', 'a close found after an open tag is past position 0, and without a tag end is -1: end is never 0'),
    'diffusion_rl.tasks.sudoku.x_answer_cells__mutmut_42': ('if ch in DIGITS and start <= pos + offset <= end:', "the character at end is the '<' of the close tag, or there is none (end = len(text)): never a digit"),
    'diffusion_rl.tasks.sudoku.x__d1_cell_reward__mutmut_7': ('return d1_rewards.d1_sudoku_reward(None, tagged, **fields)', "d1's Sudoku reward does not read the prompts"),
    'diffusion_rl.tasks.sudoku.xǁSudokuTaskǁreward_token_mask__mutmut_17': ('zip(tokens, answer_cells(tokens, len(puzzle)), strict=None)', 'answer_cells gives one list per token: the two zipped sequences always have the same length'),
    'diffusion_rl.tasks.sudoku.xǁSudokuTaskǁreward_token_mask__mutmut_20': ('zip(tokens, answer_cells(tokens, len(puzzle)), )', 'answer_cells gives one list per token: the two zipped sequences always have the same length'),
    'diffusion_rl.tasks.sudoku.xǁSudokuTaskǁreward_token_mask__mutmut_25': ('zip(tokens, answer_cells(tokens, len(puzzle)), strict=False)', 'answer_cells gives one list per token: the two zipped sequences always have the same length'),
    'diffusion_rl.tasks.sudoku.xǁSudokuTaskǁtoken_rewards__mutmut_11': ('empty = sum(c == "0" for c in puzzle) or 2', "the divisor of a puzzle without an empty cell, where every token's numerator is 0"),
    'diffusion_rl.tasks.sudoku.x_load_sudoku_csv__mutmut_13': ('encoding="UTF-8-SIG"', 'codec names are case-insensitive: the same codec'),
    'diffusion_rl.tasks.sudoku.x_load_sudoku_csv__mutmut_16': ('header_seen = None', _NONE_FALSE),
    'diffusion_rl.tasks.sudoku.x__row_problem__mutmut_15': ('return "XXsolution contradicts the puzzle\'s givensXX"', 'the words of the reason a bad row is refused with (the refusal itself is tested)'),
    'diffusion_rl.tasks.sudoku.x__row_problem__mutmut_16': ('return "SOLUTION CONTRADICTS THE PUZZLE\'S GIVENS"', 'the words of the reason a bad row is refused with (the refusal itself is tested)'),
}

# Kinds of equivalent mutants, recognised from the changed line alone: (what, why). A kind holds a
# mutant apart when the original and the mutated line read the same once the kind's part is taken out.
_DEVICE = re.compile(r",?\s*device=(None|[\w.]+(\[\d+\])?)")
_EXPONENT = re.compile(r"\b\d+(\.\d*)?[eE][-+]?\d+\b")
_FLOAT_WORD = re.compile(r'float\("([-+]?)(inf|nan)"\)', re.IGNORECASE)
EQUIVALENT_KINDS: dict[str, tuple[Callable[[str], str], str]] = {
    "device": (lambda line: re.sub(r"\(\s*,\s*", "(", re.sub(r",\s*\)", ")", _DEVICE.sub("", line))),
               "a device argument dropped or set to None: the tests run on the one device there is, the CPU "
               "(a GPU run would tell these apart; the tests that run there are the benchmarks')"),
    "float word": (lambda line: _FLOAT_WORD.sub(lambda m: f'float("{m[1]}{m[2].lower()}")', line),
                   'float("-inf") and float("-INF") are the same number: Python reads the word in any case'),
    "same number": (lambda line: _EXPONENT.sub(lambda m: repr(float(m[0])), line),
                    "a literal written another way with the same value (1e30 and 1e+30)"),
}


def equivalent_kind(diff: str) -> str | None:
    """The kind of :data:`EQUIVALENT_KINDS` a mutant is, from mutmut's diff of it (one changed line,
    or lines changed alike), or None."""
    minus = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if not minus or len(minus) != len(plus):
        return None
    for kind, (strip, _) in EQUIVALENT_KINDS.items():
        if all(strip(a) == strip(b) for a, b in zip(minus, plus)):
            return kind
    return None

def modules() -> list[str]:
    """Every module mutation testing covers, as paths under src/diffusion_rl, sorted."""
    out = []
    for area in AREAS:
        for path in sorted((PACKAGE / area).rglob("*.py")):
            rel = path.relative_to(PACKAGE).as_posix()
            if path.name != "__init__.py" and rel not in EXCLUDED:
                out.append(rel)
    return out


def tests_of(module: str) -> str:
    """The tests a module is held to: those of its area, ``tests/unit/<area>``."""
    return f"tests/unit/{module.split('/', 1)[0]}"


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", "-")


def mutmut_table(module: str) -> str:
    """The ``[tool.mutmut]`` table of one module's run."""
    lines = [
        "[tool.mutmut]",
        'source_paths = ["src"]',
        f'only_mutate = ["src/diffusion_rl/{module}"]',
        f'pytest_add_cli_args_test_selection = ["{tests_of(module)}"]',
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]',
        f"also_copy = {json.dumps(list(ALSO_COPY))}",
        f"do_not_mutate_patterns = {json.dumps(list(NOT_MUTATED))}",
    ]
    if module.split("/", 1)[0] in FORKSERVER_AREAS:
        lines.append('process_isolation = "forkserver"')
    return "\n".join(lines) + "\n"


def command(max_children: int) -> list[str]:
    return [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)]


def prepare(module: str) -> Path:
    """A fresh work folder for one module: links to the repository's folders and the config."""
    folder = WORK / slug(module)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in ("src", "tests", *ALSO_COPY):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    project = (ROOT / "pyproject.toml").read_text()
    if "[tool.mutmut]" in project:
        raise SystemExit("pyproject.toml holds a [tool.mutmut] table: scripts/mutate.py writes its own per module")
    (folder / "pyproject.toml").write_text(project + "\n" + mutmut_table(module))
    return folder


@dataclass
class Score:
    module: str
    total: int
    killed: int
    survived: list[str]
    no_tests: list[str]
    equivalent: list[str]
    seconds: float
    diffs: dict[str, str] = field(default_factory=dict)  # mutmut's diff of each survivor read
    commit: str = ""  # the commit the run started from ("+changes": with uncommitted changes)

    @property
    def score(self) -> float:
        counted = self.total - len(self.equivalent)
        return self.killed / counted if counted else 1.0

    def line(self) -> str:
        return (f"{self.module}: {self.total} mutants, {self.killed} killed, {len(self.survived)} survived, "
                f"{len(self.no_tests)} no tests, {len(self.equivalent)} equivalent; "
                f"score {100 * self.score:.1f}% in {self.seconds:.0f} s at {self.commit}")


def commit_of(root: Path) -> str:
    """The commit the repository is at, with ``+changes`` when files differ from it (what a score is of)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain") else "")


def show(folder: Path, name: str) -> str:
    """mutmut's diff of one mutant against the original."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=folder, capture_output=True, text=True)
    return out.stdout


def classify(codes: dict[str, int | None], is_equivalent) -> tuple[int, list[str], list[str], list[str]]:
    """mutmut's exit code per mutant -> (killed, survived, no tests, equivalent), through mutmut's own
    table of codes (``mutmut.stats.status_by_exit_code``): a failing test or a timeout kills; a mutant
    that is not run, interrupted or suspicious is not a kill; ``is_equivalent(name)`` holds a survivor
    apart when :data:`EQUIVALENT` explains it."""
    from mutmut.stats import status_by_exit_code

    killed, survived, no_tests, equivalent = 0, [], [], []
    for name, code in sorted(codes.items()):
        status = status_by_exit_code[code]
        if status in ("killed", "timeout"):
            killed += 1
        elif status == "no tests":
            no_tests.append(name)
        elif status == "survived" and is_equivalent(name):
            equivalent.append(name)
        else:
            survived.append(name)
    return killed, survived, no_tests, equivalent


def tally(module: str, folder: Path, seconds: float) -> Score:
    """Read mutmut's results of one module (``mutants/<path>.meta``) and hold the equivalent mutants apart."""
    meta = json.loads((folder / "mutants" / "src" / "diffusion_rl" / f"{module}.meta").read_text())
    codes: dict[str, int | None] = meta["exit_code_by_key"]

    diffs: dict[str, str] = {}

    def is_equivalent(name: str) -> bool:
        entry, diffs[name] = EQUIVALENT.get(name), show(folder, name)
        return (entry is not None and entry[0] in diffs[name]) or equivalent_kind(diffs[name]) is not None

    killed, survived, no_tests, equivalent = classify(codes, is_equivalent)
    return Score(module, len(codes), killed, survived, no_tests, equivalent, seconds, diffs)


def run(module: str, max_children: int) -> Score:
    folder = prepare(module)
    commit = commit_of(ROOT)
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # tiny tensors: one thread per test process
        env.setdefault(key, "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    start = time.monotonic()
    done = subprocess.run(command(max_children), cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    (folder / "mutmut.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f"{module}: mutmut failed ({done.returncode}); {folder / 'mutmut.log'}:\n{tail}")
    (folder / "run.json").write_text(json.dumps({"commit": commit, "seconds": seconds}))
    return scored(module, folder)


def scored(module: str, folder: Path) -> Score:
    """The score of a module's finished run in ``folder`` with the equivalents as listed now, and its
    survivors' diffs written to ``survivors.txt``."""
    run_info = json.loads((folder / "run.json").read_text())
    score = tally(module, folder, run_info["seconds"])
    score.commit = run_info["commit"]
    diffs = [f"# {name}\n{score.diffs.get(name) or show(folder, name)}" for name in score.survived + score.no_tests]
    (folder / "survivors.txt").write_text("\n".join(diffs))
    return score


def rescore(module: str) -> Score:
    """:func:`scored` for the last run of ``module`` (``--rescore``: after listing an equivalent mutant,
    without running the mutants again; the score still names the commit the mutants ran at)."""
    folder = WORK / slug(module)
    if not (folder / "run.json").exists():
        raise SystemExit(f"{module}: no finished run in {folder}; run it first: python scripts/mutate.py {module}")
    return scored(module, folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="paths under src/diffusion_rl (rl/advantages.py), or all")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests, run nothing")
    parser.add_argument("--dry-run", action="store_true", help="prepare the folders and print the commands only")
    parser.add_argument("--rescore", action="store_true",
                        help="score the last run of each module again with the equivalents listed now; runs no mutant")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1,
                        help="mutants tested at once (default: the number of CPUs)")
    args = parser.parse_args(argv)
    known = modules()
    if args.list:
        for m in known:
            print(f"{m}  ->  {tests_of(m)}")
        return 0
    chosen = known if args.modules == ["all"] else args.modules
    unknown = [m for m in chosen if m not in known]
    if not chosen or unknown:
        parser.error(f"unknown module(s) {unknown}; allowed: all or one of: {', '.join(known)}")
    scores = []
    for m in chosen:
        if args.dry_run:
            folder = prepare(m)
            print(f"# {m}: in {folder}\n{mutmut_table(m)}$ {' '.join(command(args.max_children))}\n")
            continue
        try:
            score = rescore(m) if args.rescore else run(m, args.max_children)
        except SystemExit as failed:  # one module's failure (its log names why) does not stop the others
            print(failed, flush=True)
            continue
        print(score.line(), flush=True)
        for name in score.survived + score.no_tests:
            print(f"    {name}")
        scores.append(score)
    if len(scores) > 1:
        print("\n| module | mutants | killed | survived | no tests | equivalent | score | time | commit |")
        print("|---|---|---|---|---|---|---|---|---|")
        for s in scores:
            print(f"| `{s.module}` | {s.total} | {s.killed} | {len(s.survived)} | {len(s.no_tests)} | "
                  f"{len(s.equivalent)} | {100 * s.score:.1f}% | {s.seconds:.0f} s | {s.commit} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
