"""GPU check of the native models: each architecture (LLaDA, Dream, SDAR) at ~1B parameters with
random weights in bf16 -- the sampler (256 tokens), one StableDRL update with LoRA and one without --
printing tokens/s, the update's model-FLOP utilisation (MFU) against the GPU's bf16 peak, and peak
memory. Random weights: speed and memory do not depend on them.

    python benchmarks/gpu_check.py                          # a GPU, bf16: a few minutes on an H100-class card
    python benchmarks/gpu_check.py --peak-tflops 989        # a GPU this script does not know
    python benchmarks/gpu_check.py --tiny --device cpu      # the same code path on tiny fp32 models, short sequences
    python benchmarks/gpu_check.py --memory-table           # the weight-memory table of docs/real_models.md (no run)

What is measured, per architecture:
- **sampler**: ``--batch`` prompts of ``--prompt-len`` random tokens, ``--gen-length`` tokens in
  ``--steps`` steps, greedy; LLaDA / Dream with the masked-diffusion sampler (blocks of 32), SDAR with
  the block sampler and its key/value cache (the checkpoint's blocks of 4). tokens/s = generated
  tokens / wall time.
- **update**: one StableDRL inner update (old-policy scores, policy scores, backward, AdamW step) on a
  rollout of that size, K = 2 ELBO samples (SDAR: the staircase estimator), activation checkpointing
  on as in the presets; LoRA r = 128 on the presets' targets, or full fine-tuning. MFU = model FLOPs
  of the update / time / peak, the FLOPs counted by ``torch.utils.flop_counter`` on a separate,
  untimed pass without checkpointing (so recomputation is not counted as useful work).
- **peak memory**: ``torch.cuda.max_memory_allocated`` over each phase (not available on CPU).

``--train`` also runs the user's path twice at that size: ``src/train.py`` on a checkpoint in LLaDA's
released layout (random weights, its vocabulary) for 2 StableDRL steps on GSM8K-length prompts, with
evaluation before, during and after RL -- once with ``trainer=gpu`` and once with ``trainer=fsdp
trainer.devices=1`` -- checks that every forward of the policy (rollouts, old log-probs, updates,
evaluations) ran on the accelerator, and prints the measured peak against the memory model's
prediction for that size (``benchmarks/memory.py``, fitted here on the CPU with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion  # noqa: E402

from diffusion_rl.likelihood.elbo import ELBOConfig, ELBOEstimator  # noqa: E402
from diffusion_rl.likelihood.staircase import StaircaseConfig, StaircaseEstimator  # noqa: E402
from diffusion_rl.models.adapters import prepare_for_training  # noqa: E402
from diffusion_rl.models.dream import DreamConfig, DreamModel  # noqa: E402
from diffusion_rl.models.llada import LLaDAConfig, LLaDAModelLM  # noqa: E402
from diffusion_rl.models.llada2 import LLaDA2Config, LLaDA2MoeModelLM  # noqa: E402
from diffusion_rl.models.native import NativeDiffusionLM  # noqa: E402
from diffusion_rl.models.policy import ModelConfig, PolicyBundle, logits_fn  # noqa: E402
from diffusion_rl.models.sdar import SDARConfig, SDARForCausalLM  # noqa: E402
from diffusion_rl.rl.batch import Rollout  # noqa: E402
from diffusion_rl.rl.objectives.base import StepContext  # noqa: E402
from diffusion_rl.rl.objectives.stabledrl import StableDRL, StableDRLConfig  # noqa: E402
from diffusion_rl.sampling import SamplerConfig, sample  # noqa: E402

# ~1B parameters each, with the released vocabularies (the embeddings are a large share at this size)
ONE_B = {
    "llada": (LLaDAModelLM, LLaDAConfig(d_model=2048, n_heads=16, n_kv_heads=16, n_layers=12, mlp_hidden_size=5632)),
    "dream": (DreamModel, DreamConfig(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                                      num_hidden_layers=12, intermediate_size=5632)),
    "sdar": (SDARForCausalLM, SDARConfig(hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                         num_hidden_layers=12, intermediate_size=6144, block_size=4, mask_token_id=151669)),
}
TINY = {
    "llada": (LLaDAModelLM, LLaDAConfig(d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=128,
                                        vocab_size=512, embedding_size=512, mask_token_id=500, eos_token_id=501,
                                        pad_token_id=501)),
    "dream": (DreamModel, DreamConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                                      intermediate_size=128, vocab_size=512, mask_token_id=500, eos_token_id=501,
                                      pad_token_id=501, bos_token_id=501)),
    "sdar": (SDARForCausalLM, SDARConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         num_hidden_layers=2, intermediate_size=128, vocab_size=512, block_size=4,
                                         mask_token_id=500)),
}
# the released checkpoints, for --memory-table (parameter counts from our classes on the meta device)
RELEASED = {
    "llada_8b_instruct / llada_1_5": (LLaDAModelLM, LLaDAConfig()),
    "dream_7b_instruct / diffucoder_7b_instruct": (DreamModel, DreamConfig()),  # one config.json shape
    "sdar_8b_chat (trado_8b_instruct: its config.json unread)": (SDARForCausalLM, SDARConfig(block_size=4)),
    "sdar_1_7b_chat": (SDARForCausalLM, SDARConfig(hidden_size=2048, num_attention_heads=16, num_key_value_heads=8,
                                                   num_hidden_layers=28, intermediate_size=6144, block_size=4)),
    "llada2_mini / llada2_1_mini": (LLaDA2MoeModelLM, LLaDA2Config(block_size=32)),  # one config.json
    # transformers' own class on the released config.json (tests/fixtures/released/, SOURCES.json)
    "diffusion_gemma": (DiffusionGemmaForBlockDiffusion, DiffusionGemmaConfig.from_dict(json.loads(
        (ROOT / "tests/fixtures/released/DiffusionGemma-26B-A4B-it/config.json").read_text()))),
}
LORA = {"llada": r".*\.blocks\.\d+\.(q_proj|k_proj|v_proj|attn_out|ff_proj|up_proj|ff_out)",
        # the preset's regular expression (attention, the dense layer, the shared experts)
        "llada2_moe": yaml.safe_load((Path(__file__).resolve().parents[1] / "conf/model/llada2_mini.yaml").read_text())["lora_targets"],
        # attention and dense MLPs of every text layer, the self-conditioning MLP; the encoder's adapters are
        # its decoder twin's (one weight, one adapter: lora_params counts a shared weight once)
        "diffusion_gemma": yaml.safe_load((ROOT / "conf/model/diffusion_gemma.yaml").read_text())["lora_targets"]}
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "GH200": 989.0, "A100": 312.0, "A800": 312.0,
               "L40S": 362.0, "L40": 181.0, "A10G": 70.0, "A10": 125.0, "L4": 121.0, "RTX 4090": 165.0,
               "RTX 6000 Ada": 364.0, "A6000": 155.0}  # dense bf16 tensor-core peaks from the vendors' sheets


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def params(cls, config) -> tuple[int, int]:
    """(all parameters, embedding + head), counted on the meta device."""
    with torch.device("meta"):
        m = cls(config)
    emb = m.get_input_embeddings().weight.numel() + m.get_output_embeddings().weight.numel()
    return sum(p.numel() for p in m.parameters()), emb


def memory_table() -> None:
    """Weights and training state from parameter counts (no run): bf16 weights; LoRA adapters in fp32
    (peft's default) with fp32 gradients and AdamW moments (16 B / adapter parameter); full fine-tuning
    with fp32 weights, gradients and AdamW moments (16 B / parameter, the FSDP recipe of docs/real_models.md).
    Activations come on top; the largest is the fp32 logits and their gradient, 8 B x vocabulary per
    scored token."""
    gib = 2**30
    print("| preset | parameters | LoRA r=128 params | bf16 weights | LoRA training: weights + adapter state "
          "| full fine-tuning state (fp32) | fp32 logits + grad per 1k tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, (cls, config) in RELEASED.items():
        n, _ = params(cls, config)
        lora = lora_params(cls, config, 128)
        text = config.get_text_config()  # a multimodal config (DiffusionGemma) keeps its sizes in text_config
        vocab = getattr(text, "embedding_size", None) or text.vocab_size
        print(f"| {name} | {n / 1e9:.2f} B | {lora / 1e6:.0f} M | {2 * n / gib:.1f} GiB | {(2 * n + 16 * lora) / gib:.1f} GiB "
              f"| {16 * n / gib:.0f} GiB | {1000 * vocab * 8 / gib:.2f} GiB |")


def lora_params(cls, config, r: int) -> int:
    with torch.device("meta"):
        m = cls(config)
    targets = LORA.get(m.config.model_type.lower())
    total = 0
    import re

    seen: set[int] = set()  # a weight shared by two modules (DiffusionGemma's encoder and decoder) has one adapter
    for name, mod in m.named_modules():
        if not isinstance(mod, torch.nn.Linear) or id(mod.weight) in seen:
            continue
        hit = re.fullmatch(targets, "model." + name) if targets else name.rsplit(".", 1)[-1] in ModelConfig().lora_targets
        if hit:
            seen.add(id(mod.weight))
            total += r * (mod.in_features + mod.out_features)
    return total


def build(arch: str, sizes: dict, device: torch.device, dtype: torch.dtype, lora: int) -> PolicyBundle:
    cls, config = sizes[arch]
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(config)
    net = NativeDiffusionLM(model)
    cfg = ModelConfig(name="hf", dtype="bfloat16" if dtype == torch.bfloat16 else "float32", lora_r=lora,
                      gradient_checkpointing=True, lora_targets=LORA.get(arch, list(ModelConfig().lora_targets)))
    net = prepare_for_training(net, cfg)
    c = model.config
    return PolicyBundle(net, None, c.mask_token_id, c.eos_token_id or 0, c.pad_token_id or 0, model.block_size, True)


def count(n: float, unit: str = "") -> str:
    """1.13 B / 45.2 M / 3.1 k (T / G for FLOPs)."""
    for scale, suffix in ((1e12, "T"), (1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gib(device: torch.device) -> str:
    return f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if device.type == "cuda" else "n/a (cpu)"


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def random_ids(bundle: PolicyBundle, shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """Token ids below the special tokens (those sit at the top of every vocabulary here)."""
    top = min(bundle.mask_token_id, bundle.net.config.vocab_size) - 16
    return torch.randint(0, top, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def rollout(bundle: PolicyBundle, args, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = random_ids(bundle, (args.batch, args.prompt_len), 1, device)
    return prompt, torch.ones_like(prompt)


def time_sampler(bundle: PolicyBundle, args, device: torch.device) -> tuple[float, str]:
    prompt, pmask = rollout(bundle, args, device)
    cfg = SamplerConfig(gen_length=args.gen_length, steps=args.steps, block_length=32, temperature=0.0,
                        gumbel_dtype="float32")
    bundle.net.eval()
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    sample(bundle, prompt, pmask, cfg)
    sync(device)
    dt = time.perf_counter() - t0
    return args.batch * args.gen_length / dt, peak_gib(device)


def update_once(bundle: PolicyBundle, args, device: torch.device, opt) -> None:
    """One StableDRL inner update: old policy scores, policy scores, backward, optimizer step."""
    prompt, pmask = rollout(bundle, args, device)
    comp = random_ids(bundle, (args.batch, args.gen_length), 2, device)
    cmask = torch.ones_like(comp)
    rewards = torch.rand(args.batch, generator=torch.Generator().manual_seed(3)).to(device)
    adv = (rewards - rewards.mean()) / rewards.std()
    if bundle.block_size:
        est = StaircaseEstimator(StaircaseConfig(), bundle.mask_token_id)
    else:
        est = ELBOEstimator(ELBOConfig(), bundle.mask_token_id)
    est.bind(bundle)
    obj = StableDRL(StableDRLConfig(), est)
    ro = Rollout(0, args.group_size, prompt, pmask, comp, cmask, [""] * args.batch, [{}] * args.batch, rewards,
                 rewards, {}, adv)
    fwd = logits_fn(bundle.net)
    ctx = StepContext(ro, 0, 0, fwd, fwd, None)
    bundle.net.eval()
    obj.precompute_old_logp(ctx, 1)  # the old policy's scores, as with old_policy=precomputed
    ctx.old_policy = None
    bundle.net.train()
    loss, _ = obj.loss(ctx)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def time_update(bundle: PolicyBundle, args, device: torch.device) -> tuple[float, float, str]:
    """-> (seconds of one timed update, model FLOPs of one update, peak memory)."""
    from torch.utils.flop_counter import FlopCounterMode

    trainable = [p for p in bundle.net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-6)
    layers = [m for m in bundle.net.modules() if hasattr(m, "gradient_checkpointing")]
    for m in layers:  # count model FLOPs without the recomputation of checkpointed layers
        m.gradient_checkpointing = False
    with FlopCounterMode(display=False) as counter:
        update_once(bundle, args, device, opt)
    flops = counter.get_total_flops()
    for m in layers:
        m.gradient_checkpointing = True
    update_once(bundle, args, device, opt)  # warm-up (kernels, optimizer state)
    reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    update_once(bundle, args, device, opt)
    sync(device)
    return time.perf_counter() - t0, flops, peak_gib(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny fp32 models (a check that the script runs)")
    ap.add_argument("--arch", nargs="+", default=["llada", "dream", "sdar"], choices=["llada", "dream", "sdar"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=None, help="default 64 (--tiny: 16)")
    ap.add_argument("--gen-length", type=int, default=None, help="default 256 (--tiny: 32)")
    ap.add_argument("--steps", type=int, default=None, help="sampler steps; default gen-length / 2")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (else looked up)")
    ap.add_argument("--memory-table", action="store_true", help="print the weight-memory table of docs/real_models.md and exit")
    ap.add_argument("--train", action="store_true", help="also two 2-step src/train.py jobs (trainer=gpu, trainer=fsdp)")
    args = ap.parse_args()
    if args.memory_table:
        memory_table()
        return
    args.prompt_len = args.prompt_len or (16 if args.tiny else 64)
    args.gen_length = args.gen_length or (32 if args.tiny else 256)
    args.steps = args.steps or args.gen_length // 2
    device = torch.device(args.device)
    dtype = torch.float32 if args.tiny or device.type == "cpu" else torch.bfloat16
    sizes = TINY if args.tiny else ONE_B
    peak = peak_tflops(device, args.peak_tflops)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    shown = f"{peak:.0f} TFLOP/s" if peak else "unknown (MFU n/a; give --peak-tflops)"
    print(f"device: {name}, {dtype}, bf16 peak {shown}")
    print(f"batch {args.batch} x (prompt {args.prompt_len} + {args.gen_length} generated), {args.steps} sampler steps")
    print("| arch | params | sampler tokens/s | sampler peak mem | update | s/update | FLOP/update | MFU | peak mem |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arch in args.arch:
        n, _ = params(*sizes[arch])
        for lora in (128, 0):
            t_all = time.perf_counter()
            bundle = build(arch, sizes, device, dtype, lora)
            tps, smem = time_sampler(bundle, args, device) if lora else (float("nan"), "")
            secs, flops, umem = time_update(bundle, args, device)
            mfu = f"{100 * flops / secs / (peak * 1e12):.1f}%" if peak else "n/a"
            sampler = f"{tps:,.0f} | {smem}" if lora else "(same) | "
            print(f"| {arch} | {count(n)} | {sampler} | {'LoRA r=128' if lora else 'full'} | {secs:.2f} | "
                  f"{count(flops, 'FLOP')} | {mfu} | {umem} |  ({time.perf_counter() - t_all:.0f} s)", flush=True)
            del bundle
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if args.train:
        train_jobs(args, device)


def train_jobs(args, device: torch.device) -> None:
    """Two 2-step RL jobs through ``train()`` (see the module docstring); asserts the devices."""
    import tempfile

    sys.path.insert(0, str(ROOT))
    from benchmarks.memory import QUESTION, Size, fit, grid, masked_count, phases, predict
    from tests.helpers.common import compose_cfg
    from tests.helpers.released_layouts import write_checkpoint

    from diffusion_rl.app.train import train

    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    sizes = ({"d_model": 64, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 192} if args.tiny
             else {"d_model": 2048, "n_heads": 16, "n_kv_heads": 16, "n_layers": 12, "mlp_hidden_size": 5632})
    folder = write_checkpoint("llada", tmp / "model", real_ids=True, overrides=sizes)
    for split, ids in (("train", range(16)), ("test", range(16, 24))):
        (tmp / f"{split}.jsonl").write_text("".join(
            json.dumps({"question": f"{QUESTION} ({i})", "answer": "#### 90"}) + "\n" for i in ids))
    gen = args.gen_length
    common = ["model=llada_8b_instruct", f"model.path={folder}", "objective=stabledrl", "task=gsm8k", "old_policy=precomputed",
              f"task.data_path={tmp / 'test.jsonl'}", f"task.train_data_path={tmp / 'train.jsonl'}", "task.num_val=4",
              "task.prompts_per_batch=2", "task.group_size=4", "warmstart.enabled=false", "eval.every_n_steps=1",
              "eval.batch_size=8", "sampler=default", f"sampler.gen_length={gen}", f"sampler.steps={gen // 2}",
              "sampler.gumbel_dtype=float32", "trainer.max_steps=2", "trainer.checkpoint_every_n_steps=0",
              "trainer.enable_progress_bar=false"]
    cpu = device.type != "cuda"  # --device cpu: fp32 everywhere (bf16 matmuls are slow there)
    jobs = {"trainer=gpu": ["trainer=gpu"] + (["trainer.accelerator=cpu", "model.dtype=float32",
                                                "trainer.precision=32-true"] if cpu else []),
            "trainer=fsdp devices=1": ["trainer=fsdp", "trainer.devices=1"] + (
                ["trainer.accelerator=cpu", "model.dtype=float32", "trainer.strategy_kwargs.param_dtype=null"] if cpu else [])}
    coef = fit([(masked_count(s), phases(s)) for s in grid(quick=True)])
    for name, extra in jobs.items():
        seen: set[str] = set()
        hook = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda m, a, seen=seen: seen.update(str(x.device.type) for x in a if isinstance(x, torch.Tensor)))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            folder_name = name.replace(" ", "_").replace("=", "_")
            cfg = compose_cfg([*common, *extra], tmp / folder_name, tiny=False)
            summary = train(cfg, tmp / folder_name / "run")
        finally:
            hook.remove()
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
        s = Size(8, 200, gen, 126464, 2, sizes["d_model"], sizes["n_layers"])
        want = max(predict(coef[p], p, s, gpu=device.type == "cuda") for p in ("rollout", "old", "update")) / 2**30
        assert seen == {device.type}, f"{name}: forwards ran on {sorted(seen)}"
        print(f"{name}: 2 steps, before {summary.get('before')} after {summary.get('after')}; every forward on "
              f"{device.type}; peak {peak:.2f} GiB measured, activations {want:.2f} GiB predicted (+ weights and state)")


if __name__ == "__main__":
    main()
