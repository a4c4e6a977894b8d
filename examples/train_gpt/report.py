"""The demo's results: the comparison table printed at the end, demo-out/summary.json and
demo-out/loss.png (loss against step and against wall-clock time, one line per optimizer).
Also runnable alone to redraw from a summary: `python report.py demo-out/summary.json`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("dmuon", "adamw")


def table(summary: dict) -> str:
    """A fixed-width comparison of the runs in `summary` (absent runs are left out)."""
    head = (f"{'optimizer':<10} {'final loss':>10} {'val loss':>9} {'tokens/s':>9} "
            f"{'opt step ms':>11} {'comm ms':>8} {'compute ms':>10} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for name in ORDER:
        run = summary.get(name)
        if not run:
            continue
        lines.append(f"{name:<10} {run['final_loss']:>10.4f} {run['val_loss']:>9.4f} "
                     f"{run['tokens_per_second']:>9.0f} {run['optimizer_step_ms']:>11.1f} "
                     f"{run['optimizer_comm_ms']:>8.1f} {run['optimizer_compute_ms']:>10.1f} "
                     f"{run['wall_seconds']:>7.1f}")
    runs = [summary.get(n) for n in ORDER]
    if all(runs):
        d, a = runs
        lines.append(f"dmuon vs adamw at {summary['steps']} steps: final loss "
                     f"{d['final_loss']:.4f} vs {a['final_loss']:.4f} "
                     f"({'dmuon lower' if d['final_loss'] < a['final_loss'] else 'adamw lower'}), "
                     f"val loss {d['val_loss']:.4f} vs {a['val_loss']:.4f}")
    return "\n".join(lines)


def write_summary(summary: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(path)
    return path


def plot(summary: dict, out_dir: Path) -> Path:
    """loss.png: training loss against step (left) and wall-clock seconds (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"dmuon": "tab:red", "adamw": "tab:blue"}
    for name in ORDER:
        run = summary.get(name)
        if not run:
            continue
        label = f"{name} (final {run['final_loss']:.3f})"
        by_step.plot(run["history"]["step"], run["history"]["loss"], color=colors[name], label=label)
        by_time.plot(run["history"]["seconds"], run["history"]["loss"], color=colors[name],
                     label=label)
    cfg = summary.get("model", {})
    title = (f"char GPT {summary.get('params', 0) / 1e6:.1f}M params, {cfg.get('n_layer')} layers, "
             f"FSDP2 over {summary['ranks']} CPU ranks")
    fig.suptitle(title)
    for ax, xlabel in ((by_step, "step"), (by_time, "wall-clock seconds")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "loss.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python report.py demo-out/summary.json", file=sys.stderr)
        sys.exit(2)
    src = Path(sys.argv[1])
    data = json.loads(src.read_text())
    print(table(data))
    print(f"wrote {plot(data, src.parent)}")
