"""Reading runs for the offline report: run folders, their metrics and summaries, labels, the per-run
table, and the plotting helpers every panel shares (``report.py`` draws; ``report/groups.py`` groups
seeds). A run's metrics are read as ``train()`` writes them (``metrics.csv``) or as
``scripts/compact_results.py`` keeps them in ``docs/results`` (``metrics.csv.xz``)."""


from __future__ import annotations

import csv
import json
import lzma
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

SMOOTHED = {"train/reward": 0.9}  # metric -> EMA weight of the line drawn over its raw values
RAW_ALPHA = 0.3  # the raw values behind a smoothed line: visible, not competing
FINAL_WINDOW = 5  # "final reward" = mean reward of the last 5 rollouts
EVAL_PREFIX = "eval/"  # the test split's metrics before and after RL (training/evaluation.py)
VAL_PREFIX = "val/"  # the validation split's metrics every eval.every_n_steps during RL
_IGNORED_KEYS = ("hydra.", "paths.", "trainer.enable_progress_bar")
METRICS = "metrics.csv"  # one row per logged step, as train() writes it
METRICS_XZ = "metrics.csv.xz"  # the same rows and columns, compacted (report/compact.py)
FIGSIZE = (9, 4.8)  # inches, every panel
DPI = 88  # 792 x 422 pixels: the legend's 7-point labels stay legible
PALETTE_SIZE = 40  # colours of a saved panel (palette_png)


@dataclass
class RunData:
    path: Path
    overrides: list[str]
    metrics: dict[str, list[tuple[int, float]]]  # metric -> [(step, value)] in logged order
    summary: dict[str, Any] | None
    failure: dict[str, Any] | None
    label: str = ""
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.summary is None


def find_runs(root: str | Path) -> list[Path]:
    """The run folders at or below ``root``, multirun jobs in job-number order."""
    root = Path(root)
    if (root / ".hydra").is_dir():
        return [root]
    runs = sorted({p.parent.parent for p in root.rglob(".hydra/config.yaml")} |
                  {p.parent.parent for p in root.rglob(".hydra/overrides.yaml")}, key=_job_order)
    return [r for r in runs if "report" not in r.relative_to(root).parts]


def _job_order(p: Path) -> tuple:
    head = p.name.split("_", 1)[0]
    return (str(p.parent), int(head) if head.isdigit() else math.inf, p.name)


def load_run(path: Path) -> RunData:
    overrides: list[str] = []
    ov = path / ".hydra" / "overrides.yaml"
    if ov.exists():
        overrides = [str(o) for o in (yaml.safe_load(ov.read_text()) or [])]
    metrics: dict[str, list[tuple[int, float]]] = {}
    mpath = next((p for p in (path / METRICS, path / METRICS_XZ) if p.exists()), None)
    if mpath is not None:
        with open_text(mpath) as f:
            for row in csv.DictReader(f):
                step = int(float(row.get("step") or 0))
                for k, v in row.items():
                    if k != "step" and v not in ("", None):
                        metrics.setdefault(k, []).append((step, float(v)))
    summary = _read_json(path / "summary.json")
    failure = _read_json(path / "failed.json")
    return RunData(path, overrides, metrics, summary, failure)


def open_text(path: Path) -> IO[str]:
    """A text file for reading, decompressed when it ends in ``.xz``."""
    return lzma.open(path, "rt", newline="") if path.suffix == ".xz" else open(path, newline="")


def _read_json(p: Path) -> dict[str, Any] | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def run_labels(overrides: list[list[str]], names: list[str]) -> list[str]:
    """Label each run by the overrides whose values differ between the runs (``eps=5``)."""
    parsed = [parse_overrides(o) for o in overrides]
    keys = list(dict.fromkeys(k for p in parsed for k in p))
    differing = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    short = {k: k.lstrip("+~").rsplit(".", 1)[-1] for k in differing}
    if len(set(short.values())) < len(short):  # ambiguous short names: keep the full keys
        short = {k: k.lstrip("+~") for k in differing}
    labels = [",".join(f"{short[k]}={p[k]}" for k in differing if k in p) for p in parsed]
    return [lab or name for lab, name in zip(labels, names)]


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        if "=" not in o:
            continue
        k, v = o.split("=", 1)
        k = k.removeprefix("override ").strip()
        if not k.lstrip("+~").startswith(_IGNORED_KEYS):
            out[k] = v
    return out


def run_stats(run: RunData) -> dict[str, Any]:
    """The table's numbers for one run (NaN where the run logged nothing)."""
    m, s = run.metrics, run.summary or {}
    norms = [v for _, v in m.get("grad/norm", [])]
    spikes = m.get("grad/spikes_total")
    rewards = [v for _, v in m.get("train/reward", [])]
    skipped = m.get("train/skipped_updates")
    after, before = s.get("after") or {}, s.get("before") or {}
    acc_key = next(iter(after or before), None)
    return {
        "status": "ok" if not run.failed else "failed",
        "steps": s.get("optimizer_steps", max((st for st, _ in m.get("grad/norm", [])), default=0)),
        "spikes": int(spikes[-1][1]) if spikes else int(sum(v for _, v in m.get("grad/spike", []))),
        "max_grad_norm": max(norms) if norms else math.nan,
        "final_reward": sum(rewards[-FINAL_WINDOW:]) / len(rewards[-FINAL_WINDOW:]) if rewards else math.nan,
        # the share of ratios the objective clipped, over every update: 0 means eps never acted
        "clip_frac": mean(v for k in ("ratio/clip_frac_high", "ratio/clip_frac_low") for _, v in m.get(k, [])),
        "acc_key": acc_key,
        "acc_before": before.get(acc_key, math.nan) if acc_key else math.nan,
        "acc_after": after.get(acc_key, math.nan) if acc_key else math.nan,
        "skipped": int(s["skipped_updates"]) if "skipped_updates" in s else int(skipped[-1][1]) if skipped else 0,
        "error": _error_line(run),
    }


def _error_line(run: RunData) -> str:
    if not run.failed:
        return ""
    if run.failure:
        msg = f"{run.failure.get('type', 'Error')}: {run.failure.get('error', '')}"
    else:
        msg = "no summary.json (crashed, interrupted or still running)"
    msg = " ".join(msg.split()).replace("|", "/")
    return msg if len(msg) <= 120 else msg[:117] + "..."


def markdown_table(runs: list[RunData]) -> str:
    keys = {r.stats["acc_key"] for r in runs if r.stats["acc_key"]}
    acc_name = keys.pop() if len(keys) == 1 else "accuracy"
    head = ["run", "status", "steps", "grad spikes", "max grad norm", f"final reward (last {FINAL_WINDOW})",
            f"held-out {acc_name} before -> after", "skipped updates", "ratios clipped"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        st = r.stats
        status = st["status"] if not st["error"] else f"failed: {st['error']}"
        acc = f"{fmt(st['acc_before'])} -> {fmt(st['acc_after'])}" if not r.failed else "-"
        lines.append("| " + " | ".join([r.label, status, str(st["steps"]), str(st["spikes"]), fmt(st["max_grad_norm"]),
                                         fmt(st["final_reward"]), acc, str(st["skipped"]), fmt(st["clip_frac"])]) + " |")
    return "\n".join(lines)


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def fmt(x: Any) -> str:
    if not isinstance(x, (int, float)) or math.isnan(x):
        return "-"
    return f"{x:.3f}" if abs(x) < 1e6 else f"{x:.3g}"  # an exploded gradient norm stays readable


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ema(values: list[float], weight: float) -> list[float]:
    """Exponential moving average, debiased (the first values are not pulled towards 0)."""
    out, acc, norm = [], 0.0, 0.0
    for v in values:
        acc, norm = weight * acc + (1 - weight) * v, weight * norm + (1 - weight)
        out.append(acc / norm)
    return out


def constant_value(runs: list[RunData], metric: str) -> float | None:
    """The value ``metric`` has at every logged step of every run, if it never changes."""
    values = {v for r in runs for _, v in r.metrics.get(metric, [])}
    return values.pop() if len(values) == 1 else None


def finish_axes(fig, ax, path: Path, ylabel: str, title: str) -> None:
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    palette_png(path)


def palette_png(path: Path, width: int | None = None) -> None:
    """Rewrite the PNG at ``path`` with a palette of ``PALETTE_SIZE`` colours, several times smaller
    than matplotlib's RGBA file: every line colour the panels draw (matplotlib's tab10 and tab20,
    black, white) and then the image's most frequent colours (backgrounds, bands and their overlaps),
    each pixel taking the nearest, without dithering. Wider than ``width``, it is first scaled down
    by area averaging."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        rgb = img.convert("RGB")
    if width is not None and rgb.width > width:
        rgb = rgb.resize((width, round(rgb.height * width / rgb.width)), Image.Resampling.BOX)
    seen, counts = np.unique(np.asarray(rgb).reshape(-1, 3), axis=0, return_counts=True)  # (C, 3), (C,)
    colours = _line_colours()
    for i in np.argsort(-counts, kind="stable"):  # most frequent first, ties in RGB order
        if len(colours) == PALETTE_SIZE:
            break
        c = (int(seen[i, 0]), int(seen[i, 1]), int(seen[i, 2]))
        if c not in colours:
            colours.append(c)
    palette = Image.new("P", (1, 1))
    palette.putpalette([v for c in colours for v in c])
    rgb.quantize(palette=palette, dither=Image.Dither.NONE).save(path, optimize=True)


def _line_colours() -> list[tuple[int, int, int]]:
    import matplotlib

    out: list[tuple[int, int, int]] = []
    for name in ("tab10", "tab20"):
        for c in matplotlib.colormaps[name].colors:  # type: ignore[attr-defined]
            rgb = (round(255 * c[0]), round(255 * c[1]), round(255 * c[2]))
            if rgb not in out:
                out.append(rgb)
    return [*out, (0, 0, 0), (255, 255, 255)]


def clip_threshold(runs: list[RunData]) -> float | None:
    """The runs' common ``optim.grad_clip`` when they clip (drawn on gradient-norm plots)."""
    clips = {(((r.summary or {}).get("config") or {}).get("optim") or {}).get("grad_clip") for r in runs}
    clip = clips.pop() if len(clips) == 1 else None
    return float(clip) if isinstance(clip, (int, float)) and clip > 0 else None
