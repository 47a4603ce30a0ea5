"""Small local OCI images for the container backend's tests, built once and kept in podman's store.

No registry is reachable here: the base image is a Debian root file system from the host's apt sources
(mmdebstrap) imported into podman; the torch image adds the CPU wheel of torch from the host's /opt wheelhouse.
Each image is rebuilt only when podman's store lacks it; `python -m tests.containers.images [--docker]` builds
both and prints how long each took. Standard library only: it runs before the project is installed.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE_IMAGE = "localhost/gpu-console-test-base:1"
TORCH_IMAGE = "localhost/gpu-console-test-torch:1"
TORCH_VERSION = "2.13.0"
WHEELS = Path("/opt/wheels")
# One path for the whole machine, whatever TMPDIR says: CI's two passes each have a TMPDIR of their own and both
# build BASE_IMAGE on a fresh machine (tests/containers, tests/faults/test_hostile_containers.py).
LOCK = Path("/tmp/gpu-console-test-images.lock")
# Each podman or docker call is bounded: a wedged store lock (podman issue #29646) fails the test that asked,
# saying which call, instead of hanging the suite.
QUERY_TIMEOUT_S = 120
BUILD_TIMEOUT_S = 1200
TORCH_CONTAINERFILE = f"""\
FROM {BASE_IMAGE}
RUN pip install --break-system-packages --no-cache-dir --find-links /opt/wheels \\
    --index-url file:///opt/pypi/simple --extra-index-url file:///opt/pypi-more/simple torch=={TORCH_VERSION} numpy
"""


def missing_tools() -> str | None:
    """Why these images cannot be built or run here, or None."""
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt install podman runc mmdebstrap)"
    return None


def exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], check=False, timeout=QUERY_TIMEOUT_S).returncode == 0


def build_base() -> float:
    """Debian bookworm minbase with python3 and pip, imported as BASE_IMAGE; returns the seconds it took."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-console-image-") as folder:
        rootfs = Path(folder) / "rootfs.tar"
        subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-pip",
                        "bookworm", str(rootfs)], check=True, stdout=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S)
        subprocess.run(["podman", "import", "--change", "CMD=/bin/bash", str(rootfs), BASE_IMAGE], check=True,
                       stdout=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S)
    return time.monotonic() - started


def build_torch() -> float:
    """BASE_IMAGE plus torch (CPU) and numpy from /opt's wheelhouse and local indexes; returns the seconds."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-console-image-") as folder:
        (Path(folder) / "Containerfile").write_text(TORCH_CONTAINERFILE)
        subprocess.run(["podman", "build", "--runtime", "runc", "--network", "none", "-v", "/opt:/opt:ro",
                        "-t", TORCH_IMAGE, folder], check=True, stdout=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S)
    return time.monotonic() - started


def in_docker(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False,
                          timeout=QUERY_TIMEOUT_S).returncode == 0


def load_into_docker(image: str) -> float:
    """Copy `image` from podman's store into docker's (`podman save | docker load`); returns the seconds."""
    started = time.monotonic()
    saved = subprocess.Popen(["podman", "save", image], stdout=subprocess.PIPE)
    subprocess.run(["docker", "load"], stdin=saved.stdout, check=True, stdout=subprocess.DEVNULL,
                   timeout=BUILD_TIMEOUT_S)
    if saved.wait(timeout=QUERY_TIMEOUT_S) != 0:
        raise RuntimeError(f"podman save {image} failed")
    return time.monotonic() - started


def ensure(image: str, runtime: str = "podman") -> float:
    """Build `image` (and what it stands on) unless podman has it, and load it into docker's store when
    `runtime` is docker; seconds spent (0: cached). One builder at a time on this machine (pytest-xdist workers
    ask at once)."""
    spent = 0.0
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exists(BASE_IMAGE):
            spent += build_base()
        if image == TORCH_IMAGE and not exists(TORCH_IMAGE):
            if not WHEELS.is_dir():
                raise RuntimeError(f"{WHEELS} holds no torch wheel to build {TORCH_IMAGE} from")
            spent += build_torch()
        if runtime == "docker" and not in_docker(image):
            spent += load_into_docker(image)
    return spent


def docker_unusable() -> str | None:
    """Why docker cannot run the backend's tests here (not installed, no daemon answers), or None."""
    if shutil.which("docker") is None:
        return "docker is not installed (apt install docker.io)"
    try:
        answer = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker does not answer: {exc}"
    return None if answer.returncode == 0 else f"no docker daemon runs here ({answer.stderr.strip()[:200]})"


if __name__ == "__main__":
    # `--docker`: also load them into docker's store where a docker daemon runs (.ci/run builds them this way in
    # the background while it installs and lints: the container tests then find them, or wait on LOCK).
    why = missing_tools()
    if why:
        sys.exit(why)
    runtime = "docker" if "--docker" in sys.argv[1:] and docker_unusable() is None else "podman"
    for name in (BASE_IMAGE, TORCH_IMAGE):
        print(f"{name} ({runtime}): {ensure(name, runtime):.1f} s", flush=True)
