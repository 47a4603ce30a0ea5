"""Small local OCI images for the container backend's tests, built once and kept in podman's store.

No registry is reachable here: the base image is a Debian root file system from the host's apt sources
(mmdebstrap) imported into podman; the torch image adds the CPU wheel of torch from the host's /opt wheelhouse.
Each image is rebuilt only when podman's store lacks it; `python -m tests.containers.images` builds both and
prints how long each took.
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
LOCK = Path(tempfile.gettempdir()) / "gpu-console-test-images.lock"
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
    return subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0


def build_base() -> float:
    """Debian bookworm minbase with python3 and pip, imported as BASE_IMAGE; returns the seconds it took."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-console-image-") as folder:
        rootfs = Path(folder) / "rootfs.tar"
        subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-pip",
                        "bookworm", str(rootfs)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["podman", "import", "--change", "CMD=/bin/bash", str(rootfs), BASE_IMAGE], check=True,
                       stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def build_torch() -> float:
    """BASE_IMAGE plus torch (CPU) and numpy from /opt's wheelhouse and local indexes; returns the seconds."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-console-image-") as folder:
        (Path(folder) / "Containerfile").write_text(TORCH_CONTAINERFILE)
        subprocess.run(["podman", "build", "--runtime", "runc", "--network", "none", "-v", "/opt:/opt:ro",
                        "-t", TORCH_IMAGE, folder], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def in_docker(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False).returncode == 0


def load_into_docker(image: str) -> float:
    """Copy `image` from podman's store into docker's (`podman save | docker load`); returns the seconds."""
    started = time.monotonic()
    saved = subprocess.Popen(["podman", "save", image], stdout=subprocess.PIPE)
    subprocess.run(["docker", "load"], stdin=saved.stdout, check=True, stdout=subprocess.DEVNULL)
    if saved.wait() != 0:
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


if __name__ == "__main__":
    why = missing_tools()
    if why:
        sys.exit(why)
    for name in (BASE_IMAGE, TORCH_IMAGE):
        print(f"{name}: {ensure(name):.1f} s")
