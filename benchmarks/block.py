"""Block diffusion speed: the one-pass staircase ELBO against one forward per block, and the block
sampler with its key/value cache against recomputing the clean prefix at every step.

For 4, 8 and 16 blocks of 8 tokens (a 16-token prompt, completions of 32, 64 and 128 tokens) on the
embedded model in block-causal mode (default size, untrained: speed does not depend on the weights),
prints the wall time of each and the ratio baseline / new, all measured in this run (median of
``--repeats``). The estimate is timed as training uses it: forward and backward, ``K = 2`` samples.
The sampler runs greedily with 2 tokens committed per step; it also checks that both samplers give
the same tokens.

    python benchmarks/block.py [--threads 2] [--batch 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from diffusion_rl.likelihood.staircase import StaircaseConfig, StaircaseEstimator  # noqa: E402
from diffusion_rl.models.build import build_policy  # noqa: E402
from diffusion_rl.models.policy import ModelConfig, encode_prompts, logits_fn  # noqa: E402
from diffusion_rl.sampling import SamplerConfig  # noqa: E402
from diffusion_rl.sampling.block import block_generate  # noqa: E402

BLOCK = 8


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sample(net, ids, mask, cfg, mask_id, use_cache, outs):
    def run():
        outs[use_cache] = block_generate(net, ids, mask, cfg, BLOCK, mask_id, use_cache=use_cache).completion
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b = build_policy(ModelConfig(block_size=BLOCK))
    net = b.net
    fwd = logits_fn(net)
    ids, mask = encode_prompts(b.tokenizer, ["1203004000102300"] * args.batch, pad_to_multiple_of=BLOCK)  # 2 blocks
    seeds = list(range(args.batch))
    one, loop = (StaircaseEstimator(StaircaseConfig(num_samples=2, one_pass=p), b.mask_token_id, BLOCK) for p in (True, False))

    def estimate(est, comp, cmask):
        def run():
            net.zero_grad(set_to_none=True)
            est(fwd, ids, mask, comp, cmask, seeds).sum().backward()
        return run

    print(f"block size {BLOCK}, batch {args.batch}, prompt {ids.shape[1]} tokens, {args.threads} threads, "
          f"median of {args.repeats}; ratio = baseline time / new time")
    print(f"{'blocks':>6s} {'L':>4s} | {'staircase s':>11s} {'per-block s':>11s} {'ratio':>6s} | "
          f"{'cached s':>9s} {'uncached s':>10s} {'ratio':>6s} {'same tokens':>11s}")
    for nb in (4, 8, 16):
        L = nb * BLOCK
        comp = torch.randint(5, 90, (args.batch, L), generator=torch.Generator().manual_seed(nb))
        cmask = torch.ones(args.batch, L)
        net.train()
        t_one = median_time(estimate(one, comp, cmask), args.repeats)
        t_loop = median_time(estimate(loop, comp, cmask), args.repeats)
        net.eval()
        cfg = SamplerConfig(gen_length=L, block_length=BLOCK, steps=L // 2, temperature=0.0)
        outs: dict[bool, torch.Tensor] = {}
        t_cache = median_time(sample(net, ids, mask, cfg, b.mask_token_id, True, outs), args.repeats)
        t_nocache = median_time(sample(net, ids, mask, cfg, b.mask_token_id, False, outs), args.repeats)
        same = bool(torch.equal(outs[True], outs[False]))
        print(f"{nb:6d} {L:4d} | {t_one:11.3f} {t_loop:11.3f} {t_loop / t_one:5.2f}x | "
              f"{t_cache:9.3f} {t_nocache:10.3f} {t_nocache / t_cache:5.2f}x {str(same):>11s}")


if __name__ == "__main__":
    main()
