"""Sampler speed: the batched remasking sampler against the slow reference transcription, and the
cost of keying its random numbers per row.

Prints generated tokens per second for both and their ratio, for a Sudoku-sized completion (16
tokens, 8 steps, 128 sequences) and a 256-token completion (block 32, 128 steps, 8 sequences), on the
embedded model (untrained weights: speed does not depend on them). Then, at temperature 1 (Gumbel
noise drawn at every step), the sampler with each row's noise from its own generator
(``sampling/noise.py``, what rollouts use) against one generator for the whole batch, runs
interleaved, best of ``--repeats``.

    python benchmarks/sampler.py [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.sampling.test_sampler import reference_generate  # noqa: E402

from diffusion_rl.models.build import build_policy  # noqa: E402
from diffusion_rl.models.policy import ModelConfig, encode_prompts, logits_fn  # noqa: E402
from diffusion_rl.sampling import RowNoise, SamplerConfig, generate  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="runs of each noise source (best is kept)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b = build_policy(ModelConfig())
    fwd = logits_fn(b.net.eval())
    cases = [
        ("sudoku  L=16  T=8   B=128", SamplerConfig(gen_length=16, block_length=16, steps=8, temperature=0.0), 128, 8),
        ("long    L=256 T=128 B=8  ", SamplerConfig(gen_length=256, block_length=32, steps=128, temperature=0.0), 8, 1),
    ]
    print(f"{'case':28s} {'batched tok/s':>14s} {'reference tok/s':>16s} {'ratio':>8s}")
    for name, cfg, batch, ref_batch in cases:
        prompts = ["1203004000102300="] * batch
        ids, mask = encode_prompts(b.tokenizer, prompts)
        with torch.no_grad():
            generate(fwd, ids[:2], mask[:2], cfg, b.mask_token_id)  # warm-up
            t_fast = timed(partial(generate, fwd, ids, mask, cfg, b.mask_token_id))
            # the reference handles one sequence at a time: time a few and scale per token
            t_ref = timed(partial(reference_generate, fwd, ids[:ref_batch], mask[:ref_batch], cfg, b.mask_token_id))
        fast = batch * cfg.gen_length / t_fast
        ref = ref_batch * cfg.gen_length / t_ref
        print(f"{name:28s} {fast:14.0f} {ref:16.0f} {fast / ref:7.1f}x")
    print(f"\n{'case, temperature 1':28s} {'per-row tok/s':>14s} {'one-stream tok/s':>16s} {'ratio':>8s}")
    for name, cfg, batch, _ in cases:
        for remasking in ("low_confidence", "random"):
            c = replace(cfg, temperature=1.0, remasking=remasking)
            ids, mask = encode_prompts(b.tokenizer, ["1203004000102300="] * batch)
            best = {"rows": float("inf"), "one": float("inf")}
            with torch.no_grad():
                for _ in range(args.repeats):  # interleaved: a change in the machine's load hits both
                    best["rows"] = min(best["rows"], timed(partial(generate, fwd, ids, mask, c, b.mask_token_id,
                                                                   RowNoise.rows(0, 0, batch))))
                    best["one"] = min(best["one"], timed(partial(generate, fwd, ids, mask, c, b.mask_token_id)))
            rows, one = (batch * c.gen_length / best[k] for k in ("rows", "one"))
            print(f"{name[:8] + remasking[:6]:28s} {rows:14.0f} {one:16.0f} {rows / one:7.2f}x")


if __name__ == "__main__":
    main()
