"""A short AdamW learning-rate sweep on the demo's own model and step budget: runs
`train.py --optimizers adamw --adamw-lr LR` once per LR (each relaunched by train.py under its
--launcher; same seed, data order, schedule and steps), then prints a table of lr, final train
loss (mean of the last 10 steps) and validation loss, and writes <out>/sweep.json. Any other
train.py option is passed through.

    python examples/train_gpt/sweep_adamw.py          # 8 lrs, preset 10m, 120 steps, 2 ranks
    python examples/train_gpt/sweep_adamw.py --lrs 1e-3,3e-3 --ranks 4 --steps 60 --launcher mpirun

At the defaults a run takes about 3 minutes on 2 idle cores (1,470 characters/s), 7 to 18
minutes while other jobs load them.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--lrs", default="2e-4,3e-4,5e-4,1e-3,2e-3,3e-3,5e-3,1e-2",
                   help="comma-separated AdamW lrs")
    p.add_argument("--ranks", type=int, default=2,
                   help="FSDP2 ranks per run (the global batch, so the data, does not depend on it)")
    p.add_argument("--out", default="sweep-out", help="folder: one sub-folder per lr, sweep.json")
    args, passthrough = p.parse_known_args(argv)
    lrs = [float(v) for v in args.lrs.split(",") if v.strip()]
    out = Path(args.out)
    rows = []
    for lr in lrs:
        run_dir = out / f"lr_{lr:g}"
        cmd = [sys.executable, str(HERE / "train.py"), "--optimizers", "adamw", "--adamw-lr",
               repr(lr), "--ranks", str(args.ranks), "--out", str(run_dir), *passthrough]
        print(f"[sweep] {' '.join(cmd)}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call(cmd)
        wall = time.perf_counter() - start
        row = dict(lr=lr, returncode=rc, command_seconds=wall, final_loss=math.nan,
                   val_loss=math.nan, optimizer_step_ms=math.nan)
        summary_path = run_dir / "summary.json"
        if rc == 0 and summary_path.exists():
            run = json.loads(summary_path.read_text())["adamw"]
            row.update(final_loss=run["final_loss"], val_loss=run["val_loss"],
                       optimizer_step_ms=run["optimizer_step_ms"])
        rows.append(row)
    finite = [r for r in rows if math.isfinite(r["final_loss"])]
    best = min(finite, key=lambda r: r["val_loss"]) if finite else None
    print(f"{'adamw lr':>9} {'final loss':>10} {'val loss':>9} {'run s':>7}")
    for r in rows:
        mark = "  <- best (val)" if r is best else ("" if r["returncode"] == 0 else
                                                      f"  (exit {r['returncode']})")
        print(f"{r['lr']:>9.0e} {r['final_loss']:>10.4f} {r['val_loss']:>9.4f} "
              f"{r['command_seconds']:>7.0f}{mark}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(dict(ranks=args.ranks, passthrough=passthrough,
                                                    runs=rows, best_lr=best and best["lr"]),
                                               indent=2) + "\n")
    print(f"[sweep] wrote {out / 'sweep.json'}", flush=True)
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
