"""The demo's results: the comparison table printed at the end, demo-out/summary.json and
demo-out/loss.png (loss against step and against wall-clock time, one line per optimizer).
Also runnable alone to redraw from a summary: `python report.py demo-out/summary.json`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ("meshmuon", "adamw", "torch_muon")
COLORS = {"meshmuon": "tab:red", "adamw": "tab:blue", "torch_muon": "tab:green"}


def _procs(summary: dict, run: dict) -> str:
    # older summaries have no per-run ranks/threads: every run was on summary["ranks"]
    ranks, threads = run.get("ranks", summary.get("ranks")), run.get("threads")
    return f"{ranks}x{threads}" if threads else f"{ranks}"


def table(summary: dict) -> str:
    """A fixed-width comparison of the runs in `summary` (absent runs are left out). `opt step
    ms` is the mean of optimizer.step() over all steps on rank 0 (`median` without the first
    steps' outliers); `ranks x thr` the processes and threads each one had."""
    head = (f"{'optimizer':<10} {'final loss':>10} {'val loss':>9} {'tokens/s':>9} "
            f"{'opt step ms':>11} {'median':>7} {'comm ms':>8} {'compute ms':>10} {'wall s':>7} "
            f"{'ranks x thr':>11}  NS products")
    lines = [head, "-" * len(head)]
    for name in ORDER:
        run = summary.get(name)
        if not run:
            continue
        median = run.get("optimizer_step_ms_median", float("nan"))
        lines.append(f"{name:<10} {run['final_loss']:>10.4f} {run['val_loss']:>9.4f} "
                     f"{run['tokens_per_second']:>9.0f} {run['optimizer_step_ms']:>11.1f} "
                     f"{median:>7.1f} {run['optimizer_comm_ms']:>8.1f} "
                     f"{run['optimizer_compute_ms']:>10.1f} {run['wall_seconds']:>7.1f} "
                     f"{_procs(summary, run):>11}  {run.get('ns_precision', '-')}")
    d = summary.get("meshmuon")
    for other in ("adamw", "torch_muon"):
        o = summary.get(other)
        if d and o:
            lines.append(f"meshmuon vs {other} at {summary['steps']} steps: final loss "
                         f"{d['final_loss']:.4f} vs {o['final_loss']:.4f} "
                         f"({'meshmuon lower' if d['final_loss'] < o['final_loss'] else other + ' lower'}"
                         f"), val loss {d['val_loss']:.4f} vs {o['val_loss']:.4f}, optimizer step "
                         f"{d['optimizer_step_ms']:.1f} vs {o['optimizer_step_ms']:.1f} ms")
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
    for name in ORDER:
        run = summary.get(name)
        if not run:
            continue
        label = (f"{name} (final {run['final_loss']:.3f}, opt step "
                 f"{run['optimizer_step_ms']:.0f} ms, {_procs(summary, run)} ranks x threads)")
        by_step.plot(run["history"]["step"], run["history"]["loss"], color=COLORS[name], label=label)
        by_time.plot(run["history"]["seconds"], run["history"]["loss"], color=COLORS[name],
                     label=label)
    cfg = summary.get("model", {})
    title = (f"char GPT {summary.get('params', 0) / 1e6:.1f}M params, {cfg.get('n_layer')} layers, "
             f"FSDP2 over {summary['ranks']} CPU ranks"
             f"{' (torch_muon: 1 process, unsharded)' if summary.get('torch_muon') else ''}")
    fig.suptitle(title)
    for ax, xlabel in ((by_step, "step"), (by_time, "wall-clock seconds")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
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
