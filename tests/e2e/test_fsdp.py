"""``trainer=fsdp`` (FSDP2) executed, not inspected: gloo processes on the CPU.

- Two processes through ``src/train.py`` on a tiny checkpoint in LLaDA's released layout equal the
  one-process run on the same global batch: every step's loss, reward and gradient norm, and the
  updated weights (fp32, 1e-5 relative); LoRA on and off, GRPO and StableDRL, and BGPO, whose loss is
  backpropagated copy by copy (one case in the default tier, the rest ``-m slow``). The checkpoint holds
  what trained (a LoRA one is far smaller than the base's weights) and ``src/eval.py`` scores it as the
  run did.
- The same through a two-node ``torchrun`` launch on localhost (slow).
- SIGKILL under FSDP2 and resume from ``last`` equals the uninterrupted run (slow).
- A rollout all-gathers each unit's weights once, not once per denoising step.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusion_rl.app.cli import launcher_overrides
from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.checkpoint import is_sharded, load_sharded_tensors, sharded_keys
from tests.helpers.reference_models import checkpoint_tensors
from tests.helpers.released_layouts import write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT / "src")}
# two prompts x 4 samples = 8 rows, 4 per process; each row's noise is keyed by its global row, so the
# one-process run samples the same completions as the two processes
RUN = ["model=llada_8b_instruct", "model.dtype=float32", "old_policy=precomputed", "task.num_train=64", "task.num_test=8",
       "task.num_val=8", "task.prompts_per_batch=2", "task.group_size=4", "warmstart.enabled=false",
       "sampler.gen_length=16", "sampler.block_length=16", "sampler.steps=4",
       "trainer.max_steps=3", "trainer.enable_progress_bar=false", "trainer.checkpoint_every_n_steps=2",
       "eval.batch_size=8", "eval.every_n_steps=2", "trainer.accelerator=cpu", "diagnostics.samples_every_n_steps=0"]
FSDP = ["trainer=fsdp", "trainer.strategy_kwargs.param_dtype=null", "trainer.strategy_kwargs.reduce_dtype=null"]


@pytest.fixture(scope="module")
def llada(tmp_path_factory) -> Path:
    return write_checkpoint("llada", tmp_path_factory.mktemp("released") / "llada", real_ids=False)


@pytest.fixture(scope="module")
def llada_full_vocab(tmp_path_factory) -> Path:
    """LLaDA's layout with its 126,464-token vocabulary: a base whose size is mostly frozen embeddings,
    as at 8B (where LoRA r=128 is 4% of the parameters), unlike the tiny vocabulary's."""
    return write_checkpoint("llada", tmp_path_factory.mktemp("released") / "llada_full", real_ids=True)


def train(args: list[str], run_dir: Path, cmd: list[str] | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([*(cmd or [sys.executable]), "src/train.py", *args, f"hydra.run.dir={run_dir}",
                          f"paths.cache_dir={run_dir.parent / 'cache'}"], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=900, start_new_session=True)
    return out


def rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in r.items() if v and not k.startswith(("time/", "throughput/"))} for r in csv.DictReader(f)]


def weights(ckpt: Path, like: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The policy tensors a checkpoint holds (a file, or a sharded folder read in this process)."""
    if is_sharded(ckpt):
        assert like is not None
        return load_sharded_tensors(ckpt, {k: like[k] for k in sharded_keys(ckpt)})
    return torch.load(ckpt, weights_only=True)["state_dict"]


def assert_same_steps(a: Path, b: Path, rel: float = 1e-5) -> None:
    ra, rb = [r for r in rows(a) if "train/loss" in r], [r for r in rows(b) if "train/loss" in r]
    assert len(ra) == len(rb) >= 3  # a rollout's mu updates all run: StableDRL (mu=2) takes 4
    for x, y in zip(ra, rb):
        for key in ("train/loss", "grad/norm", "train/reward"):
            if key in x or key in y:
                u, v = float(x[key]), float(y[key])
                assert abs(u - v) <= rel * max(abs(u), abs(v)) + 1e-9, (x["step"], key, u, v)


def assert_same_weights(a: Path, b: Path, rel: float = 1e-5) -> None:
    ref = weights(b / "checkpoints" / "last.ckpt")
    got = weights(a / "checkpoints" / "last.ckpt", like=ref)
    assert set(got) == set(ref) and any(k.startswith("policy.") for k in got)
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v, rtol=rel, atol=1e-7, msg=k)


def two_processes_equal_one(args: list[str], tmp_path: Path) -> None:
    """``args`` under FSDP2 on two gloo processes (``two/``) and in one process (``one/``): the same
    steps and weights."""
    two = train([*args, *FSDP, "trainer.devices=2"], tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    one = train(args, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    assert_same_steps(tmp_path / "two", tmp_path / "one")
    assert_same_weights(tmp_path / "two", tmp_path / "one")


CASES = [pytest.param(0, "stabledrl", id="full-stabledrl"),
         pytest.param(8, "grpo", id="lora-grpo", marks=pytest.mark.slow),
         pytest.param(8, "stabledrl", id="lora-stabledrl", marks=pytest.mark.slow),
         pytest.param(0, "grpo", id="full-grpo", marks=pytest.mark.slow),
         # one backward per masked copy (Objective.loss_parts): 16 gradient reductions per update
         pytest.param(0, "bgpo", id="full-bgpo", marks=pytest.mark.slow)]


@pytest.mark.parametrize("lora,objective", CASES)
def test_two_process_fsdp_equals_one_process(request, tmp_path, lora, objective):
    if lora:
        pytest.importorskip("peft")
    llada = request.getfixturevalue("llada_full_vocab" if lora else "llada")
    args = [*RUN, f"model.path={llada}", f"model.lora_r={lora}", f"objective={objective}"]
    two_processes_equal_one(args, tmp_path)
    last = tmp_path / "two" / "checkpoints" / "last.ckpt"
    base = sum(p.stat().st_size for p in llada.glob("*.safetensors"))
    if lora:  # the adapters and their optimizer state, in one file: far smaller than the frozen base
        assert last.is_file() and last.stat().st_size < base / 10
        assert all("lora_" in k for k in torch.load(last, weights_only=True)["state_dict"])
    else:  # full fine-tuning: sharded, one file per process
        assert is_sharded(last) and len(list(last.glob("*.distcp"))) == 2
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    ev = subprocess.run([sys.executable, "src/eval.py", f"ckpt_path={tmp_path / 'two'}", "eval.steps_per_token=0.25",
                         f"hydra.run.dir={tmp_path / 'ev'}", "eval.progress=false"], cwd=ROOT, env=ENV,
                        capture_output=True, text=True, timeout=600)
    assert ev.returncode == 0, ev.stderr[-3000:]
    scored = json.loads((tmp_path / "ev" / "eval_summary.json").read_text())
    assert scored["by_length"]["16"]["cell_accuracy"] == pytest.approx(summary["after"]["cell_accuracy"])


@pytest.fixture(scope="module")
def llada2(tmp_path_factory) -> Path:
    return write_checkpoint("llada2", tmp_path_factory.mktemp("released") / "llada2", real_ids=False)


def test_two_process_fsdp_equals_one_process_for_the_mixture_of_experts(llada2, tmp_path):
    """LLaDA2 (models/llada2.py): each decoder layer, its experts and router included, is one FSDP2
    unit; a process whose tokens reach no token of some expert still reduces that expert's (zero)
    gradient. Two processes equal one; the sharded checkpoint keeps the ``expert_bias`` buffers as
    released and leaves out the frozen routers' weights, as it does every frozen weight."""
    args = [*RUN, "model=llada2_mini", f"model.path={llada2}", "model.lora_r=0", "objective=grpo",
            "objective.mu=1", "sampler.gen_length=32", "sampler.block_length=32", "eval.every_n_steps=0"]
    two_processes_equal_one(args, tmp_path)
    released = checkpoint_tensors(llada2)
    ref = weights(tmp_path / "one" / "checkpoints" / "last.ckpt")
    got = weights(tmp_path / "two" / "checkpoints" / "last.ckpt", like=ref)
    biases = [k for k in got if k.endswith("mlp.gate.expert_bias")]  # a buffer: kept, never trained
    assert biases and all(torch.equal(got[k], released[k[k.index("model.layers."):]]) for k in biases)
    assert not any(k.endswith("mlp.gate.weight") for k in got)  # frozen: read from the base on resume


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_node_torchrun_launch_equals_one_process(llada, tmp_path):
    """``torchrun --nnodes=2 --nproc_per_node=1`` on localhost: two nodes of one process each."""
    args = [*RUN, f"model.path={llada}", "model.lora_r=8", "objective=stabledrl"]
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                               f"--node_rank={r}", "--master_addr=127.0.0.1", f"--master_port={port}", "src/train.py",
                               *args, *FSDP, "trainer.num_nodes=2", "trainer.devices=1", f"hydra.run.dir={tmp_path / 'two'}",
                               f"paths.cache_dir={tmp_path / 'cache'}"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    assert not (tmp_path / "two" / "train_process_1.log").read_text().count("Traceback")
    one = train(args, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    assert_same_steps(tmp_path / "two", tmp_path / "one")
    assert_same_weights(tmp_path / "two", tmp_path / "one")


@pytest.mark.slow
def test_sigkill_under_fsdp_then_resume_equals_uninterrupted(llada, tmp_path):
    args = [*RUN, f"model.path={llada}", "model.lora_r=0", "objective=grpo", *FSDP, "trainer.devices=2"]
    full = train(args, tmp_path / "a")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = train([*args, "fault=kill", "fault.at_step=2"], tmp_path / "b")  # after the step-2 checkpoint
    assert killed.returncode == -9 and not (tmp_path / "b" / "summary.json").exists(), killed.stderr[-3000:]
    resumed = train([*args, "ckpt_path=last"], tmp_path / "b")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert rows(tmp_path / "a") == rows(tmp_path / "b")  # every metric, as text
    a, b = (tmp_path / d / "checkpoints" / "last.ckpt" for d in "ab")
    template = {k: torch.empty(size, dtype=dtype) for k, (size, dtype) in _shapes(a).items()}
    wa, wb = load_sharded_tensors(a, template), load_sharded_tensors(b, template)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _shapes(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every policy tensor of a sharded checkpoint, from its metadata."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return {k.removeprefix("state_dict."): (tuple(m.size), m.properties.dtype)
            for k, m in meta.items() if k.startswith("state_dict.")}


# ---- one rollout, one all-gather per unit ------------------------------------------------------------
def _rollout_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from diffusion_rl.app.train import build
    from diffusion_rl.training.module import DiffusionRLModule
    from diffusion_rl.training.strategy import FSDPOptions, fsdp_units, shard
    from tests.helpers.common import compose_cfg

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    torch.manual_seed(0)
    c = build(compose_cfg(["old_policy=precomputed", "sampler.steps=8"], Path(out).parent))
    module = DiffusionRLModule(c.bundle, c.task, c.objective, c.advantage, c.sampler, c.optim, old_policy="precomputed")
    shard(module.policy, init_device_mesh("cpu", (world,)), FSDPOptions())
    calls, real = [0], dist.all_gather_single

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    dist.all_gather_single = counting  # what FSDP2 all-gathers a unit's shards with
    items = c.task.splits.train[:2]
    module.rollout(items)  # gathers once (training/strategy.py gathered)
    once = calls[0]
    calls[0] = 0
    module.rollouts(items, module.policy, 1)  # the sampler through the sharded module, step by step
    per_step = calls[0]
    dist.all_gather_single = real
    if rank == 0:
        Path(out).write_text(json.dumps({"once": once, "per_step": per_step, "units": len(fsdp_units(module.policy)),
                                         "layers": len(module.policy.blocks), "steps": c.sampler.steps}))
    dist.barrier()  # neither process leaves the group while the other still talks to it
    dist.destroy_process_group()
    # Leave without the interpreter's teardown. Rarely (once in CI, once in about 120 runs here) a process
    # aborted with SIGABRT, "terminate called without an active exception": C++'s message for a thread object
    # destroyed while its thread still runs, as in static destructors at exit (gloo's threads, FSDP2's
    # asynchronous all-gathers). The counts are written and flushed above; the teardown is not under test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_a_rollout_gathers_each_unit_once(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "counts.json"
    mp.spawn(_rollout_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    n = json.loads(out.read_text())
    assert n["units"] == n["layers"] + 1  # the decoder layers and the root (embeddings, norm, head)
    assert n["once"] == n["units"]
    # without it: the layers re-gather at every one of the 8 denoising steps (the root stays gathered)
    assert n["per_step"] == (n["units"] - 1) * n["steps"] + 1


# ---- launchers -------------------------------------------------------------------------------------
def test_torchrun_and_srun_processes_share_one_run_folder():
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "2", "RANK": "1"}
    with pytest.raises(ConfigError, match="hydra.run.dir=None is invalid: give it when torchrun starts several"):
        launcher_overrides(["trainer=fsdp"], torchrun)
    assert launcher_overrides(["hydra.run.dir=out/x"], torchrun) == ["hydra.output_subdir=null",
                                                                    "hydra.job.name=train_process_1"]
    assert launcher_overrides(["hydra.run.dir=out/x"], {**torchrun, "RANK": "0"}) == []
    slurm = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "4242"}
    assert launcher_overrides([], slurm) == ["hydra.run.dir=outputs/runs/slurm-4242"]
    with pytest.raises(ConfigError, match="--multirun"):
        launcher_overrides(["-m", "seed=0,1"], slurm)
    assert launcher_overrides([], {"WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == []  # Lightning's own launcher
    assert launcher_overrides([], {}) == []


def test_several_processes_refuse_a_distributed_sampler():
    """Lightning's distributed samplers are told by class (DistributedSampler and its subclasses), not
    by name: each process must read the same prompts and keep its rows."""
    from types import SimpleNamespace

    from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

    from diffusion_rl.training.module import DiffusionRLModule

    class Shuffled(DistributedSampler):  # a subclass whose name says nothing
        pass

    data = list(range(8))
    check = DiffusionRLModule._check_data_parallel
    for sampler in (DistributedSampler(data, num_replicas=2, rank=0), Shuffled(data, num_replicas=2, rank=1)):
        with pytest.raises(ConfigError, match="use_distributed_sampler"):
            check(SimpleNamespace(trainer=SimpleNamespace(world_size=2, train_dataloader=DataLoader(data, sampler=sampler))))
    quiet = [(2, DataLoader(data, sampler=SequentialSampler(data))), (1, DataLoader(data, sampler=Shuffled(data, 1, 0)))]
    for world, loader in quiet:
        check(SimpleNamespace(trainer=SimpleNamespace(world_size=world, train_dataloader=loader)))
