"""The checks that need a real NVIDIA GPU, in one short run for a lent GPU machine (no console, no database).

    python3 benchmarks/device_check.py [--seconds 10] [--preset-steps 300] [--skip-presets]

1. The NVML backend (workers/agent/gpus/nvml.py) on the real driver: the devices and driver it finds, then one
   sample a second while a bf16 matrix-product load runs on GPU 0 under the agent's job shim, with the job's
   process attached to the GPU: utilization, memory, temperature, power, clocks and the job's own memory as the
   agent would post them.
2. The shim gives a job exactly the GPU it names (CUDA_VISIBLE_DEVICES by UUID): the job sees one device.
3. The training presets on the GPU (benchmarks/presets.py --device cuda --size large): samples/s and peak
   memory beside baseline-fp32.
4. A container job with the GPU passed by UUID, when podman or docker is on the machine (else it says so).

It prints everything; figures go into the closing note. It needs only PyTorch and nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workers.agent.gpus import open_backend  # noqa: E402  (after the sys.path fix above)

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
n = 0
started = time.time()
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    n += 20
took = time.time() - started
print(f"load: {n} bf16 8192^3 products in {took:.1f} s = {2 * 8192**3 * n / took / 1e12:.0f} TFLOP/s", flush=True)
"""
SEES = "import torch; print('job sees', torch.cuda.device_count(), 'GPU(s):', torch.cuda.get_device_name(0))"


def shim(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "workers.agent.shim", "--grace", "5", "--", *argv]


def nvml_under_load(seconds: float) -> None:
    backend = open_backend()
    devices = backend.devices()
    print(f"## NVML backend: {type(backend).__name__}, driver {backend.driver_info()}")
    for d in devices:
        print(f"  GPU {d.index}: {d.name} ({d.gpu_type}), {d.memory_mb} MiB, uuid {d.uuid}")
    idle = backend.sample()[0]
    print(f"  idle: util {idle.utilization_pct} %, mem {idle.memory_used_mb} MiB, {idle.temperature_c} C, "
          f"{idle.power_w} W of {idle.power_limit_w} W, SM {idle.sm_clock_mhz} MHz")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[0].uuid}
    job = subprocess.Popen(shim([sys.executable, "-c", LOAD, str(seconds)]), cwd=REPO, env=env)
    backend.attach_job(0, 1, job.pid)
    print(f"{'t s':>5}{'util %':>8}{'mem MiB':>9}{'bw %':>6}{'temp C':>8}{'power W':>9}{'SM MHz':>8}"
          f"  job processes (pid: MiB)")
    started = time.time()
    while job.poll() is None:
        s = backend.sample()[0]
        procs = ", ".join(f"{p.pid}: {p.memory_mb}" for p in s.processes) or "-"
        print(f"{time.time() - started:>5.0f}{s.utilization_pct!s:>8}{s.memory_used_mb!s:>9}"
              f"{s.memory_bandwidth_pct!s:>6}{s.temperature_c!s:>8}{s.power_w!s:>9}{s.sm_clock_mhz!s:>8}  {procs}"
              f"{'  throttled: ' + ','.join(s.throttle_reasons) if s.throttle_reasons else ''}", flush=True)
        time.sleep(1.0)
    print(f"  load exit code {job.returncode}")
    backend.detach_job(0, 1)
    print(f"  XID events: {backend.poll_xid_events(100)}")
    seen = subprocess.run(shim([sys.executable, "-c", SEES]), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    print(f"## the shim's job with CUDA_VISIBLE_DEVICES={devices[0].uuid}: {seen.stdout.strip()} "
          f"(exit {seen.returncode}) {seen.stderr.strip()[-300:]}")
    backend.close()


def presets(steps: int) -> None:
    print(f"\n## presets on the GPU, large sizes, {steps} steps", flush=True)
    subprocess.run([sys.executable, "benchmarks/presets.py", "--device", "cuda", "--size", "large", "--steps",
                    str(steps), "--workloads", "tiny-lm,cnn-digits", "--timeout", "120",
                    "--presets", "baseline-fp32,amp-bf16,throughput,memory-saver"], cwd=REPO, check=False)


def container(uuid: str) -> None:
    runtime = shutil.which("podman") or shutil.which("docker")
    if runtime is None:
        print("\n## container job with a GPU: no podman or docker on this machine: not run")
        return
    gpu = ["--device", f"nvidia.com/gpu={uuid}"] if runtime.endswith("podman") else ["--gpus", f"device={uuid}"]
    listed = subprocess.run([runtime, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                            text=True, check=False)
    images = [line for line in listed.stdout.split() if "<none>" not in line]
    if not images:  # (nothing can be pulled on such a machine)
        print(f"\n## container job with a GPU: {runtime} has no local image: not run")
        return
    print(f"\n## container job with a GPU through {runtime}, image {images[0]}:", flush=True)
    done = subprocess.run([runtime, "run", "--rm", *gpu, images[0], "nvidia-smi", "-L"], capture_output=True,
                          text=True, check=False, timeout=120)
    print(f"  exit {done.returncode}: {done.stdout.strip()} {done.stderr.strip()[-300:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--preset-steps", type=int, default=300)
    parser.add_argument("--skip-presets", action="store_true")
    args = parser.parse_args()
    nvml_under_load(args.seconds)
    if not args.skip_presets:
        presets(args.preset_steps)
    import pynvml

    pynvml.nvmlInit()
    container(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
