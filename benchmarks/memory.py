"""Peak memory of the RL step's phases, measured on the CPU at scaled sizes, and the per-GPU peak it
predicts for the LLaDA-8B recipes of docs/real_models.md.

    python benchmarks/memory.py                       # targets, the scaled grid, the fit, the recipes
    python benchmarks/memory.py --baseline 1e4862f    # also one StableDRL step of that revision vs this tree
    python benchmarks/memory.py --quick               # a smaller grid

How memory is measured: torch's CPU allocator reports every tensor allocation and free to the
profiler together with the running total of bytes its tensors hold (``torch.profiler`` with
``profile_memory=True``: the ``total_allocated`` of each allocation event). A phase's peak is the
largest total inside it above what was held when it began: activations, logits, noise, gradients --
the tensors a GPU would hold too -- and not the Python process or the allocator's caches. The whole
step's peak resident memory (``ru_maxrss``, what the OS counts) is measured in a subprocess.

What it prints:

1. the targets, in one run each against the path that computes every logit (today's code before the
   head was split from the body; ``--baseline REV`` runs that revision's own ``src/train.py``):
   - one StableDRL step (ELBO, K=2, 4 GSM8K-length rollouts of 256 tokens) on a tiny LLaDA-layout model
     (d=64, 2 layers) with LLaDA's 126,464-token vocabulary: peak resident memory;
   - the likelihood's forward + backward at that vocabulary: peak tensor memory, split head vs full logits;
   - one sampler call: peak tensor memory, block logits vs every position's;
2. each phase (rollout call, old log-probs, update) measured over a grid of rows, lengths, vocabularies,
   K and model sizes, and a non-negative least-squares fit of its peak on the terms the code allocates
   (per-layer activations, MLP activations, the head's logits chunk, attention scores);
3. the fit's prediction at LLaDA-8B for each recipe of docs/real_models.md, plus the weights, gradients and optimizer
   state computed from parameter counts, per GPU: **predicted, not measured** (no GPU ran it).

CPU runs are fp32; on the GPU the network's activations are bf16 (half) while the head's log-softmax
chunks stay fp32, and attention runs in a fused kernel that holds no (T, T) scores: the prediction
applies exactly those three conversions to the fitted terms, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler's start / stop lines
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from diffusion_rl.likelihood.base import mask_seeds  # noqa: E402
from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator  # noqa: E402
from diffusion_rl.models import heads  # noqa: E402
from diffusion_rl.models.adapters import enable_activation_checkpointing  # noqa: E402
from diffusion_rl.models.llada import LLaDAConfig, LLaDAModelLM  # noqa: E402
from diffusion_rl.models.native import NativeDiffusionLM  # noqa: E402
from diffusion_rl.models.policy import logits_fn  # noqa: E402
from diffusion_rl.sampling import RowNoise, SamplerConfig  # noqa: E402
from diffusion_rl.sampling.sampler import generate  # noqa: E402

LLADA_VOCAB = 126464
GiB = 2**30


# ---- measuring --------------------------------------------------------------------------------------
def peak_bytes(fn) -> int:
    """Peak bytes held by CPU tensors while ``fn()`` runs, above what was held when it began."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    peak, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and str(node.extra_fields.device) == "cpu":
            peak = max(peak, int(node.extra_fields.total_allocated))
    return peak


def full_logits(net):
    """Every position's logits, sliced afterwards: how the estimators and the sampler called the network
    before the head was split from the body (a plain callable, so nothing asks for fewer)."""
    def forward(ids, attn, position_ids=None):
        return net(input_ids=ids, attention_mask=attn).logits.float()
    return forward


@dataclass(frozen=True)
class Size:
    rows: int
    prompt: int
    gen: int
    vocab: int
    K: int
    d: int
    layers: int
    masked: int | None = None  # the ELBO's masked (scored) tokens over its K copies; None: 3/4 of them (t ~ U(0.5, 1))
    ffn_width: int | None = None  # the MLP's per-token width where it is not LLaDA's 3 d (LLaDA2's experts)

    @property
    def T(self) -> int:
        return self.prompt + self.gen

    @property
    def heads(self) -> int:
        return max(1, self.d // 32)

    @property
    def ffn(self) -> int:
        return self.ffn_width or 3 * self.d  # LLaDA-8B: 12288 = 3 x 4096


def model(s: Size, checkpointing: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LLaDAConfig(d_model=s.d, n_heads=s.heads, n_kv_heads=s.heads, n_layers=s.layers, mlp_hidden_size=s.ffn,
                      vocab_size=s.vocab, embedding_size=s.vocab, mask_token_id=s.vocab - 1, eos_token_id=s.vocab - 2,
                      pad_token_id=s.vocab - 2, max_sequence_length=4096)
    net = NativeDiffusionLM(LLaDAModelLM(cfg)).float()
    if checkpointing:  # as the presets train (model.gradient_checkpointing=true)
        enable_activation_checkpointing(net)
    return net


def batch(s: Size) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, s.vocab - 2, (s.rows, s.prompt), generator=g)
    comp = torch.randint(0, s.vocab - 2, (s.rows, s.gen), generator=g)
    return prompt, torch.ones_like(prompt), comp, torch.ones(s.rows, s.gen)


def masked_count(s: Size) -> Size:
    """``s`` with the number of tokens the ELBO's masks actually draw at this size (the head runs on them)."""
    from dataclasses import replace

    prompt, pmask, comp, cmask = batch(s)
    est = ELBOEstimator(ELBOConfig(num_samples=s.K), s.vocab - 1)
    _, masked, _, _ = est.draw(mask_seeds(0, 1, s.rows, 0), pmask, cmask)
    return replace(s, masked=int(masked.sum()))


def phases(s: Size, split: bool = True) -> dict[str, int]:
    """Peak tensor bytes of one rollout call, the old log-probs and one update at size ``s``."""
    net = model(s)
    fwd = logits_fn(net) if split else full_logits(net)
    prompt, pmask, comp, cmask = batch(s)
    est = ELBOEstimator(ELBOConfig(num_samples=s.K), s.vocab - 1)
    seeds = mask_seeds(0, 1, s.rows, 0)
    sampler = SamplerConfig(gen_length=s.gen, block_length=32, steps=s.gen // 32, temperature=1.0,
                            gumbel_dtype="float32")

    def rollout():
        net.eval()
        generate(fwd, prompt, pmask, sampler, s.vocab - 1, RowNoise.rows(2, 0, s.rows))

    def old():
        with torch.no_grad():
            est(fwd, prompt, pmask, comp, cmask, seeds)

    def update():
        net.train()
        est(fwd, prompt, pmask, comp, cmask, seeds).sum().backward()
        net.zero_grad(set_to_none=True)

    return {"rollout": peak_bytes(rollout), "old": peak_bytes(old), "update": peak_bytes(update)}


# ---- the memory model ---------------------------------------------------------------------------------
def terms(phase: str, s: Size, chunk: int | None = None) -> np.ndarray:
    """What the code allocates in a phase, in tensor elements; the fit finds bytes per element.

    rollout: per-layer activations of the whole sequence (no grad: one layer at a time), MLP ones,
    the block's logits / softmax / noise, attention scores. old: the same for K noisy copies, the
    head on the masked tokens in chunks. update: one saved input per layer (checkpointing), one layer
    recomputed, the head's chunk with its backward, attention scores, the gradients of the weights."""
    chunk = chunk or heads.HEAD_CHUNK or max(1, heads.HEAD_CHUNK_ELEMENTS // s.vocab)
    rows_k = s.rows * s.K
    scored = min(s.masked if s.masked is not None else int(0.75 * rows_k * s.gen), chunk)
    if phase == "rollout":
        return np.array([s.rows * s.T * s.d, s.rows * s.T * s.ffn, s.rows * 32 * s.vocab, s.rows * s.heads * s.T**2, 0])
    if phase == "old":
        return np.array([rows_k * s.T * s.d, rows_k * s.T * s.ffn, scored * s.vocab, rows_k * s.heads * s.T**2, 0])
    params = 2 * s.vocab * s.d + s.layers * (4 * s.d * s.d + 3 * s.d * s.ffn)
    return np.array([rows_k * s.T * s.d * s.layers, rows_k * s.T * (s.d + s.ffn), scored * s.vocab,
                     rows_k * s.heads * s.T**2, params])


TERMS = ("activations", "mlp", "head", "attention", "weight grads")


def nnls(A: np.ndarray, b: np.ndarray, iters: int = 100) -> np.ndarray:
    """Least squares with non-negative coefficients (Lawson and Hanson's active set)."""
    x = np.zeros(A.shape[1])
    free = np.zeros(A.shape[1], dtype=bool)
    for _ in range(iters):
        w = A.T @ (b - A @ x)  # the gradient: a bound coefficient that would grow
        if free.all() or w[~free].max(initial=0) <= 1e-10 * np.abs(A.T @ b).max():
            break
        free[np.argmax(np.where(free, -np.inf, w))] = True
        while True:
            z = np.zeros_like(x)
            z[free] = np.linalg.lstsq(A[:, free], b, rcond=None)[0]
            if (z[free] > 0).all():
                x = z
                break
            neg = free & (z <= 0)  # step back to the boundary and release what hit it
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            free &= x > 1e-12
    return x


def fit(points: list[tuple[Size, dict[str, int]]]) -> dict[str, np.ndarray]:
    out = {}
    for phase in ("rollout", "old", "update"):
        X = np.array([terms(phase, s) for s, _ in points], dtype=float)
        y = np.array([m[phase] for _, m in points], dtype=float)
        scale = X.max(0).clip(min=1)  # well conditioned columns
        coef = nnls(X / scale, y)
        out[phase] = coef / scale
    return out


def predict(coef: np.ndarray, phase: str, s: Size, gpu: bool = True) -> float:
    """Bytes of a phase at size ``s``: the fitted terms, on a GPU with bf16 activations and fused attention."""
    t = terms(phase, s).astype(float)
    if gpu:
        t[0] *= 0.5  # bf16 activations
        t[1] *= 0.5
        t[3] = 0.0  # fused attention: no (T, T) scores
        t[4] = 0.0  # the weights' gradients are in the recipe's static state (below)
    return float(coef @ t)


# ---- the recipes -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """A released model as the recipes need it: parameter counts (``benchmarks/gpu_check.py
    --memory-table``, from our classes on the meta device) and the sizes the fitted terms take."""

    name: str
    params: float
    lora: float  # LoRA r=128 parameters on the preset's targets
    layer_params: float  # one decoder layer: what FSDP gathers at a time
    dims: dict


LLADA_8B = Checkpoint("LLaDA-8B", 8.02e9, 335.5e6, 4 * 4096**2 + 3 * 4096 * 12288,
                      dict(d=4096, layers=32, vocab=LLADA_VOCAB))
# LLaDA2.0-mini / 2.1-mini: 16.26 B parameters (2 x 16,255,638,528 B + the bf16 expert biases = the released
# index's total_size, 32,511,286,784 B), LoRA on attention, the dense layer and the shared experts; a MoE
# layer is 819 M parameters. Its MLP holds per token the 8 routed copies of the hidden state (in, out, and
# the fp32 weighted sum: 4 x 8 x 2048), 4 x 9 x 512 expert activations and the fp32 accumulator: in units
# of the dense fit's 4 x ffn elements, ffn_width = (65536 + 18432 + 4096) / 4 = 22016 (an estimate from
# what models/llada2.py allocates, not fitted: the grid measures the dense LLaDA layout)
LLADA2_MINI = Checkpoint("LLaDA2-mini", 16.256e9, 45.0e6, 819.5e6,
                         dict(d=2048, layers=20, vocab=157184, ffn_width=22016))


@dataclass
class Recipe:
    name: str
    gpus: int
    lora: bool
    rows_per_gpu: int  # prompts_per_batch x group_size / GPUs: what an update scores
    rollout_rows: int  # sampler.rollout_batch_size
    eval_rows: int  # eval.batch_size

    def static(self, ckpt: Checkpoint = LLADA_8B) -> dict[str, float]:
        """Per-GPU bytes that do not depend on the batch, from parameter counts (computed)."""
        n = ckpt.params
        if self.lora:  # bf16 base (sharded under FSDP); fp32 adapters, their gradients and AdamW moments
            base = 2 * n / self.gpus
            state = 16 * ckpt.lora / self.gpus
        else:  # fp32 master weights, gradients and AdamW moments, all sharded
            base = 4 * n / self.gpus
            state = 12 * n / self.gpus
        # the KL anchor (objective.beta > 0): LoRA switches the adapters off, full fine-tuning keeps a
        # frozen fp32 copy, sharded like the policy
        reference = 0.0 if self.lora else 4 * n / self.gpus
        gathered_rollout = 2 * n if self.gpus > 1 else 0.0  # FSDP: the bf16 weights, gathered once
        gathered_layer = 2 * 2 * ckpt.layer_params if self.gpus > 1 else 0.0  # two bf16 layers
        return {"weights": base, "state": state, "reference": reference, "rollout_gather": gathered_rollout,
                "layer_gather": gathered_layer}


RECIPES = [Recipe("1 GPU, LoRA, StableDRL (K=2)", 1, True, 16, 8, 64),
           Recipe("8 GPUs FSDP, full fine-tuning, StableDRL (K=2)", 8, False, 16, 8, 64),
           Recipe("8 GPUs FSDP, LoRA, StableDRL (K=2)", 8, True, 16, 8, 64)]


def recipe_table(coef: dict[str, np.ndarray], prompt: int = 200, gen: int = 256, K: int = 2,
                 ckpt: Checkpoint = LLADA_8B) -> list[str]:
    lines = ["| per GPU (GB, predicted) | " + " | ".join(r.name for r in RECIPES) + " |",
             "|---" * (len(RECIPES) + 1) + "|"]
    cols = []
    for r in RECIPES:
        st = r.static(ckpt)
        roll = predict(coef["rollout"], "rollout", Size(r.rollout_rows, prompt, gen, K=1, **ckpt.dims))
        ev = predict(coef["rollout"], "rollout", Size(r.eval_rows, prompt, gen, K=1, **ckpt.dims))
        old = predict(coef["old"], "old", Size(r.rows_per_gpu, prompt, gen, K=K, **ckpt.dims))
        upd = predict(coef["update"], "update", Size(r.rows_per_gpu, prompt, gen, K=K, **ckpt.dims))
        fixed = st["weights"] + st["state"] + st["reference"]
        peaks = {"rollout": fixed + st["rollout_gather"] + roll, "evaluation": fixed + st["rollout_gather"] + ev,
                 "old log-probs": fixed + st["layer_gather"] + old, "update": fixed + st["layer_gather"] + upd}
        cols.append([st["weights"], st["state"], st["reference"], st["rollout_gather"], roll, ev, old, upd,
                     max(peaks.values())])
    names = ["weights (bf16 LoRA base / fp32 master, per GPU)", "gradients + AdamW state",
             "reference policy (beta > 0): adapters off / sharded fp32 copy", "FSDP: weights gathered for a rollout",
             "rollout call activations", "evaluation batch activations", "old log-probs (no grad)",
             "update activations (forward + backward)", "**peak (the largest phase)**"]
    for i, n in enumerate(names):
        lines.append(f"| {n} | " + " | ".join(f"{c[i] / 1e9:.1f}" for c in cols) + " |")
    return lines


# ---- the targets --------------------------------------------------------------------------------------
def likelihood_target(rows: int = 4, gen: int = 256, prompt: int = 200) -> tuple[int, int]:
    s = Size(rows, prompt, gen, LLADA_VOCAB, 2, 64, 2)
    net = model(s)
    prompt_ids, pmask, comp, cmask = batch(s)
    est = ELBOEstimator(ELBOConfig(num_samples=2), s.vocab - 1)
    seeds = mask_seeds(0, 1, rows, 0)

    def run(fwd):
        def step():
            est(fwd, prompt_ids, pmask, comp, cmask, seeds).sum().backward()
            net.zero_grad(set_to_none=True)
        return peak_bytes(step)

    return run(full_logits(net)), run(logits_fn(net))


def sampler_target(rows: int = 4, gen: int = 256, prompt: int = 200) -> tuple[int, int]:
    s = Size(rows, prompt, gen, LLADA_VOCAB, 1, 64, 2)
    net = model(s, checkpointing=False).eval()
    prompt_ids, pmask, _, _ = batch(s)
    cfg = SamplerConfig(gen_length=gen, block_length=32, steps=gen // 32, temperature=1.0)  # LLaDA's float64 noise
    run = lambda fwd: peak_bytes(lambda: generate(fwd, prompt_ids, pmask, cfg, s.vocab - 1,  # noqa: E731
                                                  RowNoise.rows(0, 0, rows)))
    return run(full_logits(net)), run(logits_fn(net))


QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "Each clip costs 3 dollars and she put a quarter of the money into a savings jar. How many dollars "
            "did she keep for herself in April and May altogether, and how many clips did she sell?")


def step_rss(tree: Path, tmp: Path) -> float:
    """Peak resident GiB of ``src/train.py`` in ``tree`` running one StableDRL step on the tiny LLaDA layout."""
    train, test = tmp / "train.jsonl", tmp / "test.jsonl"
    for path, ids in ((train, range(8)), (test, range(8, 10))):
        path.write_text("".join(json.dumps({"question": QUESTION + f" ({i})", "answer": "#### 90"}) + "\n" for i in ids))
    args = ["model=llada_8b_instruct", f"model.path={tmp / 'model'}", "model.dtype=float32", "model.lora_r=0",
            "model.gradient_checkpointing=true", "objective=stabledrl", "task=gsm8k", f"task.data_path={test}",
            f"task.train_data_path={train}", "task.num_val=0", "task.prompts_per_batch=1", "task.group_size=4",
            "warmstart.enabled=false", "eval.before=false", "eval.after=false", "eval.every_n_steps=0",
            "sampler=default", "sampler.steps=8", "trainer.max_steps=1", "trainer.checkpoint_every_n_steps=0",
            "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp / tree.name}",
            f"paths.cache_dir={tmp / 'cache'}"]
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    out = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "src/train.py", *args], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the step failed in {tree}:\n{out.stderr[-3000:]}")
    return int(out.stdout.strip().splitlines()[-1]) / 2**20


def step_target(baseline: str | None) -> list[str]:
    from tests.helpers.released_layouts import write_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="memory_step_"))
    write_checkpoint("llada", tmp / "model", real_ids=True, overrides={"d_model": 64, "n_layers": 2, "n_heads": 4,
                                                                       "n_kv_heads": 4, "mlp_hidden_size": 192})
    lines = [f"StableDRL step (ELBO K=2, 4 rollouts x 256 tokens, d=64, 2 layers, vocab {LLADA_VOCAB}): "
             f"peak resident {step_rss(ROOT, tmp):.2f} GiB (this tree)"]
    if baseline:
        old = tmp / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), baseline], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            lines.append(f"  the same step at {baseline}: peak resident {step_rss(old, tmp):.2f} GiB")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    return lines


def grid(quick: bool) -> list[Size]:
    """Two families: the head's (vocabulary from 1k to LLaDA's, a small body) and the body's (a small
    vocabulary, width, depth, rows, length and K varied), so each term of the fit is pinned down."""
    head = Size(2, 32, 64, 4096, 2, 64, 2)
    out = {Size(head.rows, head.prompt, head.gen, v, head.K, head.d, head.layers)
           for v in (1024, 4096, 16384) + (() if quick else (65536, LLADA_VOCAB))}
    out |= {Size(r, head.prompt, head.gen, 16384, k, head.d, head.layers) for r, k in ((1, 2), (4, 2), (2, 1), (2, 4))}
    body = Size(2, 64, 128, 256, 2, 256, 4)
    out.add(body)
    for rows in (1, 4):
        out.add(Size(rows, body.prompt, body.gen, body.vocab, body.K, body.d, body.layers))
    for gen in (64, 256):
        out.add(Size(body.rows, gen // 2, gen, body.vocab, body.K, body.d, body.layers))
    for K in (1, 4):
        out.add(Size(body.rows, body.prompt, body.gen, body.vocab, K, body.d, body.layers))
    for d, layers in ((128, 4), (256, 2), (256, 8)) + (() if quick else ((512, 4), (512, 8))):
        out.add(Size(body.rows, body.prompt, body.gen, body.vocab, body.K, d, layers))
    return sorted(out, key=lambda s: (s.vocab, s.d, s.layers, s.rows, s.gen, s.K))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="a git revision whose src/train.py runs the same StableDRL step")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("# targets (one run each, split head against full logits)\n")
    for line in step_target(args.baseline):
        print(line)
    full, split = likelihood_target()
    print(f"likelihood forward + backward (ELBO K=2, 4 x 456 tokens, vocab {LLADA_VOCAB}): full logits "
          f"{full / GiB:.2f} GiB, split head {split / GiB:.2f} GiB: {full / split:.1f}x less")
    full, split = sampler_target()
    print(f"one sampler call (4 rows, 200 + 256 tokens, blocks of 32, float64 noise): every position's logits "
          f"{full / GiB:.2f} GiB, the block's {split / GiB:.2f} GiB: {full / split:.1f}x less (T / block = {456 / 32:.1f})")

    print("\n# phases over the scaled grid (peak tensor MiB, measured; fit in brackets)\n")
    points = [(masked_count(s), phases(s)) for s in grid(args.quick)]
    coef = fit(points)
    print("| rows | prompt | gen | vocab | K | d | layers | rollout | old log-probs | update |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst, errors = 0.0, []
    for s, m in points:
        cells = []
        for phase in ("rollout", "old", "update"):
            f = predict(coef[phase], phase, s, gpu=False)
            errors.append(abs(f - m[phase]) / max(m[phase], 1))
            if m[phase] >= 10 * 2**20:
                worst = max(worst, errors[-1])
            cells.append(f"{m[phase] / 2**20:.1f} ({f / 2**20:.1f})")
        print(f"| {s.rows} | {s.prompt} | {s.gen} | {s.vocab} | {s.K} | {s.d} | {s.layers} | " + " | ".join(cells) + " |")
    print(f"\nrelative error of the fit: median {np.median(errors):.1%}, largest on phases above 10 MiB {worst:.1%}")
    for phase, c in coef.items():
        print(f"{phase}: bytes per element " + ", ".join(f"{n} {v:.2f}" for n, v in zip(TERMS, c)))
    for ckpt in (LLADA_8B, LLADA2_MINI):
        print(f"\n# {ckpt.name} per GPU, prompts of 200 tokens, 256 generated (predicted from the fit, not measured)\n")
        for line in recipe_table(coef, ckpt=ckpt):
            print(line)


if __name__ == "__main__":
    main()
