"""Create the gradient-spike dashboard (docs/dashboard.md) as a W&B workspace.

    pip install 'diffusion-rl[wandb]' && wandb login
    python scripts/wandb_dashboard.py --entity ENTITY --project diffusion-rl [--name "Gradient spikes"]
    python scripts/wandb_dashboard.py --entity ENTITY --project diffusion-rl --dry-run   # print, no upload

Built with the ``wandb-workspaces`` package. ``SECTIONS`` is the dashboard: the same panels as the
table in docs/dashboard.md (a test keeps the two in step). Every line plot runs over optimizer steps
(``trainer/global_step``, the step Lightning's W&B logger writes) without smoothing, since smoothing
hides exactly the single-step spikes this dashboard is for.
"""

from __future__ import annotations

import argparse

X_AXIS = "trainer/global_step"
SAMPLES_TABLE = "samples/completions"

# section -> [(panel title, metrics on the y axis, log-scale y)]
SECTIONS: list[tuple[str, list[tuple[str, list[str], bool]]]] = [
    ("Gradient spikes", [
        ("pre-clip gradient norm", ["grad/norm", "grad/norm_ema"], True),
        ("spikes so far", ["grad/spikes_total"], False),
        ("spike flag", ["grad/spike"], False),
    ]),
    ("Importance ratios", [
        ("log-ratio mean and spread", ["ratio/log_mean", "ratio/log_std"], False),
        ("log-ratio extremes", ["ratio/log_min", "ratio/log_max"], False),
        ("clip fractions", ["ratio/clip_frac_low", "ratio/clip_frac_high"], False),
        ("effective sample size", ["weights/ess"], False),
        ("largest weight", ["weights/max"], False),
    ]),
    ("Reward and policy", [
        ("reward", ["train/reward"], False),
        ("reward spread", ["train/reward_std", "train/frac_zero_std_groups"], False),
        ("entropy", ["train/entropy"], False),
        ("completion length", ["train/completion_len"], False),
        ("loss", ["train/loss"], False),
        ("KL to the reference", ["train/kl"], False),
    ]),
    ("System", [
        ("learning rate", ["train/lr"], False),
        ("skipped updates", ["train/skipped_updates"], False),
        ("time per phase", ["time/rollout_s", "time/update_s"], False),
        ("throughput", ["throughput/tokens_per_s"], False),
    ]),
]


def build_workspace(entity: str, project: str, name: str = "Gradient spikes"):
    """The workspace object (nothing is uploaded until ``.save()``)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    sections = []
    for i, (section, panels) in enumerate(SECTIONS):
        plots = [wr.LinePlot(title=title, x=X_AXIS, y=list(ys), log_y=log_y or None,
                             point_visualization_method="bucketing-gorilla")  # keeps per-bucket maxima
                 for title, ys, log_y in panels]
        sections.append(ws.Section(name=section, panels=plots, is_open=i == 0))
    sections.append(ws.Section(name="Samples", panels=[wr.WeavePanelSummaryTable(table_name=SAMPLES_TABLE)]))
    return ws.Workspace(
        entity=entity, project=project, name=name, sections=sections,
        settings=ws.WorkspaceSettings(x_axis=X_AXIS, smoothing_type="none", smoothing_weight=0,
                                      ignore_outliers=False),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="create the gradient-spike W&B workspace")
    parser.add_argument("--entity", required=True)
    parser.add_argument("--project", default="diffusion-rl")
    parser.add_argument("--name", default="Gradient spikes")
    parser.add_argument("--dry-run", action="store_true", help="print the panels, upload nothing")
    args = parser.parse_args(argv)
    try:
        workspace = build_workspace(args.entity, args.project, args.name)
    except ImportError:
        raise SystemExit("wandb_dashboard: needs wandb-workspaces: pip install 'diffusion-rl[wandb]'") from None
    if args.dry_run:
        for section in workspace.sections:
            print(section.name)
            for p in section.panels:
                print("  ", getattr(p, "title", None) or type(p).__name__, getattr(p, "y", ""))
        return
    workspace.save()
    print(workspace.url)


if __name__ == "__main__":
    main()
