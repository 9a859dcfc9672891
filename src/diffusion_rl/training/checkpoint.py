"""Checkpoints that survive crashes: atomic writes, safe loading, one-line refusal of a bad file.

- :func:`atomic_save` and :class:`AtomicCheckpointIO` (Lightning's ``CheckpointIO`` plugin) write
  ``<name>.tmp<pid>`` in the checkpoint's own folder, fsync it and rename it over ``<name>``, so a
  kill during a write leaves the previous file whole. Lightning 2.6's own ``_atomic_save`` writes to
  a ``tempfile.mkstemp()`` file in the system temp folder and ``shutil.move``s it: a copy, not a
  rename, whenever that folder is on another file system than the run (and a kill mid-copy leaves a
  truncated ``last.ckpt``).
- :class:`RunCheckpoint`: Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` is always the final
  model: Lightning writes ``last`` at the end of a run only if no checkpoint was written during it, so
  a 10-step run checkpointing every 3 steps left ``last.ckpt`` at step 9. It also decides what a
  checkpoint holds besides Lightning's own state, and puts it back on resume (Lightning's callback
  checkpoint hooks): the LightningModule knows nothing of the layout.
- Every checkpoint carries ``checkpoint["run"]``: the run's resolved config (model, tokenizer, task,
  sampler: what ``src/eval.py`` rebuilds) and the id of its W&B run (what a resumed run continues).
- A checkpoint holds what trained (``RunCheckpoint.on_save_checkpoint``): never a frozen LoRA base or
  a frozen copy, which are rebuilt from the base the run names in ``checkpoint["run"]["base"]`` (path
  and content hash; :func:`check_base` refuses resuming on another one). Under FSDP a full fine-tuning
  checkpoint is a folder (``torch.distributed.checkpoint``: one shard file per process, the rest in
  ``meta.pt``); every function here takes either.
- :func:`resolve_checkpoint` turns ``ckpt_path`` (``last``, a run folder or a file) into a file and
  checks that it loads with ``weights_only=True`` (memory-mapped: the tensors are not read). A
  missing, truncated or foreign file stops the run in one line naming the newest readable step
  checkpoint in the same folder; ``last`` in a folder that holds no run says which folder to name.
- :func:`rng_state` / :func:`set_rng_state`: the global torch, CUDA, numpy and Python generators as
  tensors, lists and numbers, so checkpoints stay loadable with ``weights_only=True``.
- :func:`continue_csv_log`: a run resumed in its own folder keeps the CSV rows up to the checkpoint
  and drops the ones logged after it (the resumed run logs those steps again).
"""

from __future__ import annotations

import csv
import logging
import os
import random
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from diffusion_rl.core.errors import ConfigError
from diffusion_rl.training.loggers import wandb_run_id

log = logging.getLogger(__name__)


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, fsync, rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows within one file system
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable (POSIX); best effort
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with :func:`atomic_save` for local paths (remote ones: Lightning's)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_save(checkpoint, path)


RUN_KEY = "run"  # checkpoint[RUN_KEY]: {"config": resolved run config, "wandb_id": str | None, "base": ...}


@dataclass
class RunRecord:
    """What every checkpoint says about its run: ``checkpoint[RUN_KEY]`` (config, base) and the warm
    start in ``checkpoint["rl_state"]``. ``train()`` knows the config at start, the warm start and the
    base once the warm start is done; a resume keeps the warm start its checkpoint names."""

    config: dict[str, Any] | None = None  # the resolved run config: what src/eval.py rebuilds
    warm_start: dict[str, Any] | None = None  # training/warmstart.py's provenance
    base: dict[str, Any] | None = None  # where the frozen weights come from (models.build.base_identity)


def frozen_names(module: torch.nn.Module) -> list[str]:
    """State-dict keys of the tensors that do not train (frozen base, old and reference copies)."""
    return [name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad]


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is the final model, whatever the checkpoint interval,
    and which decides what a checkpoint holds besides Lightning's own state (the module knows nothing
    of it): the trainable tensors only, ``rl_state`` (the module's counters, the warm start, the global
    generators) and ``checkpoint[RUN_KEY]``."""

    def __init__(self, run: RunRecord | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.run = run if run is not None else RunRecord()
        self._rng_to_restore: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        # What trained, never a frozen tensor: a frozen base (LoRA) and a frozen reference copy are
        # rebuilt from the base the run names (checkpoint["run"]["base"], checked on resume), the old
        # policy equals the policy at every checkpoint. (Under FSDP the strategy already left them out.)
        state = checkpoint.get("state_dict")
        if state is not None:
            for name in frozen_names(pl_module):
                state.pop(name, None)
        # Plain data only: checkpoints load with weights_only=True. Mask and Gumbel generators are
        # seeded from (seed, rollout_count), the data order is the train loader's state (Lightning).
        checkpoint["rl_state"] = {"rollout_count": pl_module.rollout_count, "skipped_updates": pl_module.skipped_updates,
                                  "consecutive_skips": pl_module.consecutive_skips,
                                  "reward_failures": getattr(pl_module.task, "reward_failures", 0),
                                  "warm_start": self.run.warm_start, "rng": rng_state()}
        if pl_module.pipeline is not None:  # rollout.staleness > 0: the jobs sampled ahead, to sample again
            checkpoint["rl_state"]["pipeline"] = pl_module.pipeline.state()
        # what src/eval.py rebuilds (model, tokenizer, task, sampler) and the W&B run a resume continues
        checkpoint[RUN_KEY] = {"config": self.run.config, "wandb_id": wandb_run_id(trainer.loggers),
                               "base": self.run.base}
        for logger in trainer.loggers:  # the metrics on disk reach as far as the checkpoint
            logger.save()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """After Lightning loaded the weights (the module loads without ``strict``: the frozen tensors
        the checkpoint lacks keep their values, the base's): refuse a tensor the module does not have,
        make the old policy the policy again, and take back the counters and the warm start."""
        weights = checkpoint.get("state_dict")  # absent under FSDP: the strategy restored the shards
        if weights is not None:
            unexpected = [k for k in weights if k not in pl_module.state_dict()]
            if unexpected:
                raise RuntimeError(f"Error(s) in loading state_dict for {type(pl_module).__name__}:\n\t"
                                   "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            pl_module.sync_old_policy()
        state = checkpoint.get("rl_state", {})
        pl_module.rollout_count = state.get("rollout_count", 0)
        pl_module.skipped_updates = state.get("skipped_updates", 0)
        pl_module.consecutive_skips = state.get("consecutive_skips", 0)
        pl_module.task.reward_failures = state.get("reward_failures", 0)
        if pl_module.pipeline is not None and "pipeline" in state:
            pl_module.pipeline.load_state(state["pipeline"])
        saved, ours = state.get("warm_start"), self.run.warm_start
        if saved and ours and saved.get("key") != ours.get("key"):
            log.warning("the checkpoint's warm start (%s) differs from this config's (%s); the checkpoint's "
                        "weights are used", saved.get("key"), ours.get("key"))
        self.run.warm_start = saved or ours
        self._rng_to_restore = state.get("rng")  # applied at on_train_start, after Lightning's own setup

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        # Lightning runs checkpoint callbacks after the others, and the module's hook after them: nothing
        # draws from the generators between here and the first batch
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        with warnings.catch_warnings():
            # Lightning's 12-line advice for manual optimization: our checkpoints are meant to hold
            # the weights after the step's updates, which is what it warns they will hold
            warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.save_last and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            self._last_global_step_saved = trainer.global_step


# ---- resolving and checking a checkpoint ----------------------------------------------------------


@dataclass
class CheckpointRef:
    path: Path
    global_step: int
    run: dict[str, Any] = field(default_factory=dict)  # checkpoint[RUN_KEY] ({} in older checkpoints)


class _Unreadable(Exception):
    pass


_STEP_RE = re.compile(r"(\d+)")


SHARDED_META = "meta.pt"  # a sharded (torch.distributed.checkpoint) checkpoint folder's plain part (Lightning's name)


def is_sharded(path: Path) -> bool:
    """Whether ``path`` is a sharded checkpoint folder (``torch.distributed.checkpoint`` + ``meta.pt``)."""
    return path.is_dir() and (path / SHARDED_META).is_file() and (path / ".metadata").is_file()


def sharded_keys(path: Path) -> list[str]:
    """The tensor keys of a sharded checkpoint's ``state_dict`` (``policy.*``), read from its metadata."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return [k.removeprefix("state_dict.") for k in keys if k.startswith("state_dict.")]


def load_sharded_tensors(path: Path, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The ``state_dict`` tensors of a sharded checkpoint, in this process alone (no process group),
    into tensors shaped like ``template`` (``{key: tensor}``, keys as :func:`sharded_keys`)."""
    from torch.distributed.checkpoint import load

    state = {"state_dict": {k: torch.empty_like(v, device="cpu") for k, v in template.items()}}
    load(state, checkpoint_id=str(path), no_dist=True)
    return state["state_dict"]


def _load(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` of a diffusion_rl checkpoint (memory-mapped: tensors are not
    read; of a sharded folder, its ``meta.pt``, with the tensor names as ``sharded_keys``); raises
    :class:`_Unreadable` with a one-line reason."""
    if path.is_dir():
        if not is_sharded(path):
            raise _Unreadable("a folder, but not a sharded checkpoint (no meta.pt and .metadata)")
        blob = torch.load(path / SHARDED_META, map_location="cpu", weights_only=True)
        keys = sharded_keys(path)
        if not any(k.startswith("policy.") for k in keys):
            raise _Unreadable("holds no 'policy.*' weights (not a diffusion_rl checkpoint?)")
        return {**blob, "sharded": keys}
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is not one
        raise _Unreadable("not a PyTorch checkpoint (torch.save writes a zip archive; this file is not one)")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # noqa: BLE001 - truncated, or not weights_only-safe
        first = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0]
        raise _Unreadable(f"truncated or corrupt ({type(err).__name__}: {first[:160]})") from err
    if not isinstance(blob, dict) or not isinstance(blob.get("state_dict"), dict):
        raise _Unreadable("not a Lightning checkpoint (no state_dict)")
    if not any(k.startswith("policy.") for k in blob["state_dict"]):
        raise _Unreadable("holds no 'policy.*' weights (not a diffusion_rl checkpoint?)")
    return blob


def _inspect(path: Path) -> int:
    """The checkpoint's ``global_step``; raises :class:`_Unreadable` with a one-line reason."""
    return int(_load(path).get("global_step", 0))


def newest_readable(folder: Path, exclude: Path | None = None) -> Path | None:
    """The readable step checkpoint (not ``last*``) with the highest step in ``folder``, if any."""
    def step_of(p: Path) -> tuple[int, float]:
        nums = _STEP_RE.findall(p.stem)
        return (int(nums[-1]) if nums else -1, p.stat().st_mtime)

    candidates = [p for p in folder.glob("*.ckpt") if not p.name.startswith("last") and p != exclude]  # files or folders
    for p in sorted(candidates, key=step_of, reverse=True):
        try:
            _inspect(p)
            return p
        except _Unreadable:
            continue
    return None


def checkpoint_file(value: str | Path) -> Path:
    """A checkpoint file as given, or a run folder's ``checkpoints/last.ckpt`` (``last.ckpt`` in a
    checkpoints folder); the file may not exist."""
    path = Path(value).expanduser()
    if path.is_dir() and not is_sharded(path):
        path = path / "checkpoints" / "last.ckpt" if (path / "checkpoints").is_dir() else path / "last.ckpt"
    return path


RUNS_ROOT = Path("outputs")  # Hydra's runs and multiruns (conf/config.yaml), relative to the launch folder


def newest_run_checkpoint(root: str | Path = RUNS_ROOT) -> Path | None:
    """The most recently written ``checkpoints/last.ckpt`` below ``root`` (a folder of runs), if any."""
    root = Path(root)
    found = list(root.glob("**/checkpoints/last.ckpt")) if root.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def resolve_checkpoint(value: str, run_dir: str | Path) -> CheckpointRef:
    """``last`` -> ``<run_dir>/checkpoints/last.ckpt``; a run folder -> its ``checkpoints/last.ckpt``.

    Raises :class:`ConfigError` (one line) for a missing or unreadable file.
    """
    run_dir = Path(run_dir)
    path = run_dir / "checkpoints" / "last.ckpt" if value == "last" else checkpoint_file(value)
    if value == "last" and not (run_dir / "checkpoints").is_dir():
        # most likely a new timestamped folder: say which folder to name, not that this one is empty
        newest = newest_run_checkpoint()
        hint = f" (the newest run under {RUNS_ROOT}/ is {newest.parent.parent})" if newest else ""
        raise ConfigError("ckpt_path", value, f"resumes the run in hydra.run.dir, and {run_dir} holds no "
                          f"checkpoints: add hydra.run.dir=<run folder>{hint}, or give ckpt_path=<run folder or .ckpt>")
    if not path.exists():
        raise ConfigError("ckpt_path", value, f"no checkpoint file at {path}")
    try:
        blob = _load(path)
    except _Unreadable as err:
        good = newest_readable(path.parent, exclude=path)
        hint = f"; newest readable checkpoint there: {good}" if good else "; no readable checkpoint in that folder"
        raise ConfigError("ckpt_path", value, f"refused {path}: {err}{hint}") from None
    run = blob.get(RUN_KEY)
    return CheckpointRef(path, int(blob.get("global_step", 0)), dict(run) if isinstance(run, dict) else {})


def load_checkpoint(value: str | Path, key: str = "ckpt_path") -> tuple[Path, dict[str, Any]]:
    """A checkpoint file or run folder, loaded for evaluation: ``(file, checkpoint dict)``; a missing
    or unreadable file is a one-line :class:`ConfigError` on ``key``."""
    path = checkpoint_file(value)
    if not path.exists():
        raise ConfigError(key, str(value), f"no checkpoint file at {path}")
    try:
        return path, _load(path)
    except _Unreadable as err:
        raise ConfigError(key, str(value), f"refused {path}: {err}") from None


def check_base(ckpt: CheckpointRef, base: dict[str, Any] | None, key: str = "ckpt_path") -> None:
    """Refuse, in one line, a checkpoint whose frozen weights (left out of it) came from another base
    than this run's model: ``base`` as ``models.build.base_identity`` gives it."""
    saved = ckpt.run.get("base")
    if not saved or base is None:
        return
    same = saved.get("sha256") == base.get("sha256") if saved.get("sha256") and base.get("sha256") \
        else saved.get("path") == base.get("path")
    if not same:
        was = f"{saved.get('path')} (sha256 {str(saved.get('sha256'))[:12]})"
        now = f"{base.get('path')} (sha256 {str(base.get('sha256'))[:12]})"
        raise ConfigError(key, str(ckpt.path), f"its frozen weights are not in it and came from {was}; this run's "
                          f"model is {now}: resume with the checkpoint's base (model.path)")


# ---- global random generators ---------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """The global generators as plain data (``weights_only``-loadable)."""
    np_state = np.random.get_state(legacy=False)
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- metrics of a resumed run -------------------------------------------------------------------
def continue_csv_log(loggers: list, global_step: int) -> None:
    """Keep a CSV logger's rows up to ``global_step``, drop later ones, and hand them to the new writer.

    The rows are replayed into the fresh logger so that it knows every column (Lightning's writer
    rewrites the file with only the columns it has seen when a new one appears).
    """
    from lightning.pytorch.loggers import CSVLogger

    for lg in loggers:
        if not isinstance(lg, CSVLogger):
            continue
        path = Path(lg.log_dir) / "metrics.csv"
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        path.unlink()
        for r in rows:
            step = int(float(r.get("step") or 0))
            if step > global_step:
                continue
            lg.log_metrics({k: float(v) for k, v in r.items() if k != "step" and v not in ("", None)}, step=step)
        lg.save()
