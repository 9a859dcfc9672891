"""Fewer-forward rollouts against the exact sampler: cost, speed, agreement and accuracy in one run.

On the embedded model warm-started on 4x4 Sudoku and sampled with 256-token completions, 8 blocks of
32 (the papers evaluate Sudoku at lengths 128, 256 and 512; the answer is the first 16 tokens, EOS
follows), greedy (temperature 0), for every combination of ``sampler.decode`` (fixed: 128 steps;
threshold 0.9; factor 1.0) and ``sampler.kv_cache`` (none, prefix, dual), plus early stop, prints per
sample:

- forward passes, and forward FLOPs relative to the exact sampler (every model call attends to all
  ``T`` keys, cached or not, so a call's FLOPs are proportional to its query positions:
  ``2 N q + 4 n_layers d q T``; the ratio is that of query positions);
- wall time relative to the exact sampler, measured in this run, batch by batch, every option in
  turn on the same batch so that load changes on a shared machine hit all of them alike;
- token agreement with the exact sampler (all 256 positions) and the share of identical answers;
- held-out accuracy (``cell_accuracy`` of the empty cells, ``solved_rate``);
- for the caches, how far the cached logits are from a full forward on the same state (mean KL over
  the block's masked positions, and how often the argmax changes), on the first ``--probe`` items;
- for early stop, how often the exact sampler wrote something other than EOS where it filled.

The exact sampler is also timed against the sampler of a git ref (``--baseline-ref``, default
``main``), loaded from that commit's ``sampling/sampler.py`` and run on the same batches: the ratio
checks that the options cost the exact sampler nothing.

    python benchmarks/rollout.py [--threads 2] [--test 256] [--batch 64]

Warm start, cached under ``--cache-dir`` as training caches it: the training default (140 steps at
``gen_length=16``, ``warmstart.*`` defaults), then ``--warmstart-steps`` (100) more at
``gen_length=256`` (batch 32, lr 5e-4) so the model writes EOS after its answer. (A synthetic task
with long answers, digit chains copying the line above, was tried first: the embedded model had not
learned the copy after 475 warm-start steps, so it had no accuracy to lose.)
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from diffusion_rl.models.build import build_policy  # noqa: E402
from diffusion_rl.models.policy import ModelConfig, decode_completions, encode_prompts, logits_fn  # noqa: E402
from diffusion_rl.sampling import SamplerConfig, generate  # noqa: E402
from diffusion_rl.tasks.sudoku import SudokuConfig, SudokuTask  # noqa: E402
from diffusion_rl.training.warmstart import WarmStartConfig, warm_start  # noqa: E402

EXACT = SamplerConfig(gen_length=256, block_length=32, steps=128, temperature=0.0)
OPTIONS = [("exact (fixed, none)", {})] + [
    (f"{d}, {c}", {"decode": d, "kv_cache": c})
    for d in ("fixed", "threshold", "factor") for c in ("none", "prefix", "dual") if (d, c) != ("fixed", "none")
] + [("exact + stop_after_eos", {"stop_after_eos": True}),
     ("threshold, dual + stop_after_eos", {"decode": "threshold", "kv_cache": "dual", "stop_after_eos": True})]


def load_baseline(ref: str):
    """The ``sampling/sampler.py`` module of git ref ``ref`` (imports resolve against this tree)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:src/diffusion_rl/sampling/sampler.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_sampler.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("baseline_sampler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_sampler"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class DriftProbe:
    """A recorder comparing each step's logits with a full forward on the same state, over the masked
    positions of the block being decoded (mean KL(full || cached) and argmax changes)."""

    def __init__(self, forward, attn, mask_id: int, prompt_len: int, block_length: int):
        self.forward, self.attn, self.mask_id = forward, attn, mask_id
        self.P, self.bl = prompt_len, block_length
        self.kl = self.flips = self.n = 0.0

    def on_step(self, step, x_before, logits, candidates, committed):
        with torch.no_grad():
            full = self.forward(x_before, self.attn)  # (B, T, V) the exact step's logits
        first = int(committed.any(0).nonzero()[0, 0])  # a position of the current block
        start = self.P + (first - self.P) // self.bl * self.bl
        where = torch.zeros_like(committed)
        where[:, start:start + self.bl] = x_before[:, start:start + self.bl] == self.mask_id  # (B, T)
        lp, lq = full[where].log_softmax(-1), logits[where].float().log_softmax(-1)  # (n, V)
        self.kl += float((lp.exp() * (lp - lq)).sum())
        self.flips += float((lp.argmax(-1) != lq.argmax(-1)).sum())
        self.n += int(where.sum())

    def on_fill(self, filled, token):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--test", type=int, default=256, help="held-out items")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmstart-steps", type=int, default=100, help="warm-start steps at gen_length 256")
    ap.add_argument("--cache-dir", default=str(ROOT / "outputs" / "cache"))
    ap.add_argument("--baseline-ref", default="main")
    ap.add_argument("--probe", type=int, default=16, help="items of the first batch the cache drift is measured on")
    ap.add_argument("--init", default=None, help="a state dict to start from instead of the warm start")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bundle = build_policy(ModelConfig())
    task = SudokuTask(SudokuConfig(num_test=args.test))
    t0 = time.perf_counter()
    if args.init:
        bundle.net.load_state_dict(torch.load(args.init, map_location="cpu", weights_only=True))
        print(f"weights from {args.init}")
    else:
        key = {"task": "sudoku", "model": "tiny", "bench": "rollout"}
        first = warm_start(bundle, task, 16, WarmStartConfig(), key, f"{args.cache_dir}/warmstart", progress=True)
        ws = WarmStartConfig(steps=args.warmstart_steps, batch_size=32, lr=5e-4)
        prov = warm_start(bundle, task, EXACT.gen_length, ws, {**key, "after": first["key"]}, f"{args.cache_dir}/warmstart",
                          progress=True)
        print(f"warm start: 140 steps at gen_length 16, then {args.warmstart_steps} at 256 "
              f"({'reused' if prov['reused'] else 'trained'}, {time.perf_counter() - t0:.0f} s)")
    net = bundle.net.eval()
    fwd = logits_fn(net)
    base = load_baseline(args.baseline_ref)
    base_cfg = base.SamplerConfig(**{k: getattr(EXACT, k) for k in ("gen_length", "block_length", "steps", "temperature")})
    items = task.test_items()
    prompts = [task.prompt(it) for it in items]
    names = [n for n, _ in OPTIONS]
    cfgs = {n: replace(EXACT, **kw) for n, kw in OPTIONS}
    times = dict.fromkeys([*names, "baseline"], 0.0)
    outs: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    forwards = dict.fromkeys(names, 0.0)
    tokens = dict.fromkeys(names, 0.0)
    filled: dict[str, list[int]] = {n: [] for n in names}  # per batch: completion tokens filled per row
    drift: dict[str, DriftProbe] = {}
    same_as_baseline = True
    print(f"{len(items)} held-out items in batches of {args.batch}, {args.threads} threads")
    for s in range(0, len(items), args.batch):
        ids, mask = encode_prompts(bundle.tokenizer, prompts[s:s + args.batch])
        with torch.no_grad():
            t = time.perf_counter()
            ref = base.generate(fwd, ids, mask, base_cfg, bundle.mask_token_id).completion
            times["baseline"] += time.perf_counter() - t
            for n in names:
                t = time.perf_counter()
                out = generate(fwd, ids, mask, cfgs[n], bundle.mask_token_id, net=net, eos_id=bundle.eos_token_id)
                times[n] += time.perf_counter() - t
                outs[n].append(out.completion)
                forwards[n] += out.forwards * ids.shape[0]
                tokens[n] += out.forward_tokens * ids.shape[0]
                filled[n].append(out.filled)
                if s == 0 and cfgs[n].kv_cache != "none" and not cfgs[n].stop_after_eos:
                    k = args.probe
                    attn = None if bool(mask[:k].all()) else torch.cat(
                        [mask[:k], torch.ones(ids[:k].shape[0], EXACT.gen_length, dtype=mask.dtype)], 1)  # as the sampler
                    drift[n] = DriftProbe(fwd, attn, bundle.mask_token_id, ids.shape[1], EXACT.block_length)
                    generate(fwd, ids[:k], mask[:k], cfgs[n], bundle.mask_token_id, recorder=drift[n], net=net)
        same_as_baseline &= bool(torch.equal(ref, outs[names[0]][-1]))
        print(f"  batch {s // args.batch + 1}: exact {times[names[0]]:.0f} s so far", flush=True)
    exact = torch.cat(outs[names[0]])
    exact_text = decode_completions(bundle.tokenizer, exact, bundle.eos_token_id)
    N = len(items)
    print(f"\nexact sampler vs {args.baseline_ref}'s: same tokens {same_as_baseline}, wall-time ratio "
          f"{times[names[0]] / times['baseline']:.3f} (this / {args.baseline_ref})\n")
    head = ["option", "forwards", "FLOPs vs exact", "wall vs exact", "token agreement", "same answer",
            "cell accuracy", "solved", "KL to full", "argmax flips"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for n in names:
        comp = torch.cat(outs[n])
        text = decode_completions(bundle.tokenizer, comp, bundle.eos_token_id)
        m = task.metrics(text, items)
        d = drift.get(n)
        kl = f"{d.kl / max(d.n, 1):.4f}" if d else "-"
        flips = f"{100 * d.flips / max(d.n, 1):.2f}%" if d else "-"
        row = [n, f"{forwards[n] / N:.1f}", f"{tokens[names[0]] / tokens[n]:.1f}x fewer",
               f"{times[names[0]] / times[n]:.2f}x faster", f"{(comp == exact).float().mean():.4f}",
               f"{sum(a == b for a, b in zip(text, exact_text)) / N:.3f}", f"{m['cell_accuracy']:.3f}",
               f"{m['solved_rate']:.3f}", kl, flips]
        print("| " + " | ".join(row) + " |")
    # early stop: the exact sampler and "exact + stop_after_eos" make the same calls up to the stop, so
    # every difference lies in the filled tail (after each row's first EOS: the answers are the same)
    n, L = "exact + stop_after_eos", EXACT.gen_length
    fired = sum(f > 0 for f in filled[n])
    other = sum(int((e[:, L - f:] != bundle.eos_token_id).any(-1).sum()) for e, f in zip(outs[names[0]], filled[n]) if f)
    diff = sum(int((e != o).sum()) for e, o in zip(outs[names[0]], outs[n]))
    n_filled = sum(f * e.shape[0] for e, f in zip(outs[names[0]], filled[n]))
    print(f"\nearly stop (exact + stop_after_eos against exact): fired in {fired} of {len(filled[n])} batches, "
          f"{n_filled / N:.1f} tokens per sample filled without a forward; the exact sampler wrote something other "
          f"than EOS there in {other} of {N} rows ({diff} of {n_filled} filled tokens differ)")


if __name__ == "__main__":
    main()
