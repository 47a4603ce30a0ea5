"""The job runtime as a wheel for users' images, no login needed (it is the console's own open code, no secret):

    GET /api/v1/runtime/gpu_console_runtime-<version>-py3-none-any.whl   the wheel
    GET /api/v1/runtime/wheel/                                           302 to it (a name that does not change)

An image's build installs it with `pip install https://CONSOLE/api/v1/runtime/gpu_console_runtime-0.1.0-py3-none-any.whl`
(pip wants a URL that ends in the wheel's file name; `curl -LOJ …/runtime/wheel/` fetches it under that name).

Built on the first request, not at install time: from packaging/runtime/pyproject.toml and the sources it names
(workers/__init__.py, workers/protocol.py, workers/runtime/), with `pip wheel --no-deps --no-build-isolation
--no-index` (nothing fetched). The wheel is kept in VAR_DIR/runtime-wheel/<digest of those sources>/, so an
upgraded console builds a new one on its first request and later requests only hash the sources (~20 small
files). A file lock makes concurrent first requests, in threads or processes, build it once. SOURCE_DATE_EPOCH
fixes the archive's times: the same sources give the same wheel, and its sha256 is the ETag.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_safe

log = logging.getLogger(__name__)

PYPROJECT = Path("packaging/runtime/pyproject.toml")
# What the wheel holds, as packaging/runtime/pyproject.toml lists it; only these are staged for the build, so a
# module the pyproject names that is missing here fails the build (tests/runtime_package checks the wheel).
SOURCES = (Path("workers/__init__.py"), Path("workers/protocol.py"), Path("workers/runtime"))
BUILD_TIMEOUT_S = 300
REPRODUCIBLE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip file holds


class RuntimeWheelUnavailable(Exception):
    """The wheel cannot be built here (no sources beside the console, or no pip/setuptools)."""


@dataclass(frozen=True)
class RuntimeWheel:
    path: Path
    sha256: str

    @property
    def filename(self) -> str:
        return self.path.name


def _root() -> Path:
    return Path(settings.BASE_DIR)


def _cache() -> Path:
    return Path(settings.VAR_DIR) / "runtime-wheel"


def wheel_filename() -> str:
    """`gpu_console_runtime-0.1.0-py3-none-any.whl`, from the pyproject's name and version."""
    path = _root() / PYPROJECT
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise RuntimeWheelUnavailable(f"{PYPROJECT} is not readable beside the console ({exc})") from None
    name = str(project["name"]).replace("-", "_").replace(".", "_")
    return f"{name}-{project['version']}-py3-none-any.whl"


def _source_files() -> Iterator[Path]:
    root = _root()
    for source in (PYPROJECT, *SOURCES):
        full = root / source
        if full.is_dir():
            for path in sorted(full.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    yield path.relative_to(root)
        elif full.is_file():
            yield source
        else:
            raise RuntimeWheelUnavailable(f"{source} is not beside the console")


def sources_digest() -> str:
    digest = hashlib.sha256()
    for rel in _source_files():
        data = (_root() / rel).read_bytes()
        digest.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(target: Path, scratch: Path) -> None:
    """pip wheel on a staged copy of the sources (a build in place would leave build/ and egg-info behind)."""
    stage = scratch / "src"
    for rel in _source_files():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_root() / rel, stage / rel)
    env = {**os.environ, "SOURCE_DATE_EPOCH": REPRODUCIBLE_EPOCH, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
               "-w", str(scratch / "dist"), str(stage / PYPROJECT.parent)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env,
                                cwd=scratch, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeWheelUnavailable(f"building the runtime wheel failed: {exc}") from None
    built = scratch / "dist" / target.name
    if result.returncode != 0 or not built.is_file():
        log.error("runtime wheel build failed (exit %s): %s", result.returncode, result.stderr[-2000:])
        raise RuntimeWheelUnavailable("building the runtime wheel failed; the console's log has pip's output")
    target.parent.mkdir(parents=True, exist_ok=True)
    # The digest first: whoever sees the wheel sees its digest.
    _digest_file(target).write_text(hashlib.sha256(built.read_bytes()).hexdigest())
    os.replace(built, target)


def _digest_file(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + ".sha256")


def runtime_wheel() -> RuntimeWheel:
    """The wheel of the current sources, built now if this console has not built it yet."""
    key = sources_digest()[:20]
    cache = _cache()
    target = cache / key / wheel_filename()
    if not target.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with _locked(cache / ".lock"):
            if not target.is_file():
                with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as scratch:
                    _build(target, Path(scratch))
                for old in cache.iterdir():  # wheels of sources this console no longer has
                    if old.is_dir() and old.name != key and not old.name.startswith(".build-"):
                        shutil.rmtree(old, ignore_errors=True)
    return RuntimeWheel(target, _digest_file(target).read_text().strip())


def _unavailable(exc: RuntimeWheelUnavailable) -> JsonResponse:
    return JsonResponse({"detail": f"The job runtime's wheel is not available on this console: {exc}"}, status=503)


@require_safe
def wheel_latest(request: HttpRequest) -> HttpResponse:
    try:
        name = wheel_filename()
    except RuntimeWheelUnavailable as exc:
        return _unavailable(exc)
    return HttpResponseRedirect(reverse("runtime-wheel-file", kwargs={"filename": name}))


@require_safe
def wheel_file(request: HttpRequest, filename: str) -> HttpResponse | FileResponse:
    try:
        if filename != wheel_filename():
            return JsonResponse({"detail": f"This console serves {wheel_filename()} (at /api/v1/runtime/wheel/)."},
                                status=404)
        wheel = runtime_wheel()
    except RuntimeWheelUnavailable as exc:
        return _unavailable(exc)
    etag = f'"{wheel.sha256}"'
    response: HttpResponse | FileResponse
    if etag in request.headers.get("If-None-Match", ""):
        response = HttpResponse(status=304)
    else:
        response = FileResponse(wheel.path.open("rb"), as_attachment=True, filename=wheel.filename,
                                content_type="application/zip")
    response["ETag"] = etag
    response["Cache-Control"] = "no-cache"  # revalidate: the same name may hold a newer build after an upgrade
    return response
