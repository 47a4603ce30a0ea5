"""Benchmark the training presets against baseline-fp32 on the built-in workloads.

Not a test: it runs `python -m workers.runtime.run_builtin` once per (workload, preset), each in a fresh
process (under torchrun for the multi-process presets), and prints samples/s, peak memory and the final
loss at an equal number of optimizer steps.

    python benchmarks/presets.py                          # CPU, small sizes, a few minutes
    python benchmarks/presets.py --device cuda --size large --steps 300
    python benchmarks/presets.py --workloads tiny-lm --presets baseline-fp32,amp-bf16 --json

Reading the table: samples/s leaves out the first step (compilation, warm-up). On a GPU the warm-up lasts
longer (which part of it was not measured): on an H200, tiny-lm large, `throughput` read 0.84x baseline-fp32
over 150 steps and 2.76x over 600 (amp-bf16 1.26x and 2.46x), so use --steps 300 (the default on cuda) or more.
On the CPU, "peak" is the process's peak RSS (torch itself is ~0.4 GiB of it) and "+mem" its growth during
training; on a GPU both are torch.cuda.max_memory_allocated. ddp/fsdp rows are for N processes together (each
with the full per-process batch, so N times the samples per step); distill trains a half-width student after a teacher
(its samples/s is the student's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workers.runtime.catalog import PRESETS, WORKLOADS  # noqa: E402  (after the sys.path fix above)

SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "small": {
        "mlp-digits": {"hidden": 256, "batch_size": 64},
        "cnn-digits": {"channels": 16, "batch_size": 64},
        "tiny-lm": {"d_model": 128, "layers": 2, "seq_len": 64, "batch_size": 32},
    },
    "large": {
        "mlp-digits": {"hidden": 4096, "depth": 4, "batch_size": 512},
        "cnn-digits": {"channels": 64, "batch_size": 256},
        "tiny-lm": {"d_model": 512, "layers": 6, "heads": 8, "seq_len": 256, "batch_size": 64},
    },
}
TRAIN_PRESETS = [name for name, preset in PRESETS.items() if preset.kind == "train"]


def run_one(workload: str, preset: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run one (workload, preset) pair; returns its result record plus status and wall time."""
    run_dir = workdir / f"{workload}--{preset}"
    run_dir.mkdir(parents=True)
    progress = run_dir / "progress.jsonl"
    params = {**SIZES[args.size][workload], "epochs": 10_000, **json.loads(args.params or "{}")}
    # The workload's catalogue decides which params apply (e.g. only tiny-lm has seq_len).
    params = {k: v for k, v in params.items() if k in WORKLOADS[workload].params}
    env = {**os.environ, "CONSOLE_JOB_ID": f"bench-{workload}-{preset}", "CONSOLE_PRESET": preset,
           "CONSOLE_MAX_STEPS": str(args.steps), "CONSOLE_PROGRESS_FILE": str(progress),
           "CONSOLE_CHECKPOINT_DIR": str(run_dir / "checkpoints"), "CONSOLE_OUTPUT_DIR": str(run_dir / "output"),
           "CONSOLE_DEVICE": args.device, "PYTHONPATH": str(REPO)}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    command = [sys.executable]
    nproc = 1
    if PRESETS[preset].multi_process:
        nproc = args.nproc
        command += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    command += ["-m", "workers.runtime.run_builtin", "--workload", workload, "--kind", "train",
                "--params", json.dumps(params)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout)
        status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
        log_tail = (done.stdout + done.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        status, log_tail = "timeout", ""
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in progress.read_text().splitlines()] if progress.exists() else []
    result = next((r for r in reversed(records) if r.get("type") == "result"), {})
    row = {"workload": workload, "preset": preset, "processes": nproc, "status": status, "wall_s": wall,
           "params": params, **{k: v for k, v in result.items() if k not in ("type", "ts", "params")}}
    if status != "ok":
        row["log_tail"] = log_tail
    return row


def mib(value: Any) -> str:
    return f"{value / 2**20:,.0f}" if isinstance(value, int | float) else "-"


def number(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def table(rows: list[dict[str, Any]]) -> str:
    baselines = {r["workload"]: r for r in rows if r["preset"] == "baseline-fp32" and r["status"] == "ok"}
    header = ["workload", "preset", "procs", "precision", "samples/s", "vs base", "peak MiB", "+mem MiB",
              "final loss", "accuracy", "status"]
    lines = [header]
    for r in rows:
        base = baselines.get(r["workload"])
        speedup = (r["samples_per_s"] / base["samples_per_s"]
                   if base and r.get("samples_per_s") and base.get("samples_per_s") else None)
        lines.append([r["workload"], r["preset"], str(r["processes"]), r.get("precision", "-"),
                      number(r.get("samples_per_s"), ",.0f"), number(speedup, ".2f") + ("x" if speedup else ""),
                      mib(r.get("peak_memory_bytes")), mib(r.get("memory_increase_bytes")),
                      number(r.get("final_loss"), ".4f"), number(r.get("accuracy"), ".3f"), r["status"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) if i < 4 or i == 10 else cell.rjust(w)
                      for i, (cell, w) in enumerate(zip(line, widths, strict=True))) for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--size", choices=sorted(SIZES), help="model/batch sizes (default: small on cpu, "
                        "large on cuda)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--presets", default=",".join(TRAIN_PRESETS), help="comma-separated training presets")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default 30 on cpu, 300 on cuda)")
    parser.add_argument("--nproc", type=int, help="processes for ddp/fsdp (default 2 on cpu, all GPUs on cuda)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the runs (default: torch's choice)")
    parser.add_argument("--params", help="JSON params applied to every workload (e.g. '{\"lr\": 0.003}')")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)
    args.size = args.size or ("large" if args.device == "cuda" else "small")
    args.steps = args.steps or (300 if args.device == "cuda" else 30)
    if args.nproc is None:
        args.nproc = 2
        if args.device == "cuda":
            import torch

            args.nproc = max(1, torch.cuda.device_count())
    workloads = [w for w in args.workloads.split(",") if w]
    presets = [p for p in args.presets.split(",") if p]
    for name in workloads:
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name}")
    for name in presets:
        if name not in PRESETS or PRESETS[name].kind != "train":
            parser.error(f"{name} is not a training preset")
    if "baseline-fp32" not in presets:
        presets.insert(0, "baseline-fp32")

    rows = []
    with tempfile.TemporaryDirectory(prefix="preset-bench-") as tmp:
        for workload in workloads:
            for preset in presets:
                row = run_one(workload, preset, args, Path(tmp))
                rows.append(row)
                if not args.json:
                    print(f"  {workload:<11} {preset:<15} {row['status']:<8} {row['wall_s']:6.1f}s", file=sys.stderr,
                          flush=True)
    if args.json:
        print(json.dumps({"device": args.device, "size": args.size, "steps": args.steps, "rows": rows}, indent=2))
    else:
        print(f"\n{args.steps} optimizer steps per run, device {args.device}, size {args.size}\n")
        print(table(rows))
        for row in rows:
            if row["status"] != "ok":
                print(f"\n--- {row['workload']} {row['preset']}: {row['status']}\n{row.get('log_tail', '')}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
