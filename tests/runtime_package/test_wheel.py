"""The job runtime's wheel: built by the console from packaging/runtime, served without a login, and installed by
pip from the console's URL into a clean virtual environment (no Django, no system packages) where a job's
progress record is written through the runtime's reporting API."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import tomllib
import zipfile
from pathlib import Path

import pytest
from django.test import Client

from apps.core import runtime_package
from workers.protocol import ENV_PROGRESS_FILE, TrainingProgress

REPO = Path(__file__).resolve().parents[2]
IN_JOB = textwrap.dedent("""
    import importlib.util, json, sys
    import workers, workers.runtime
    from workers.runtime.env import RuntimeEnv
    from workers.runtime.reporting import Reporter

    env = RuntimeEnv.from_env()  # CONSOLE_PROGRESS_FILE, as the agent sets it
    reporter = Reporter(env.progress_file, enabled=env.is_main)
    reporter.progress(step=3, max_steps=10, loss=0.5, steps_per_s=2.0, samples_per_s=64.0)
    reporter.result(accuracy=0.9)
    print(json.dumps({"workers": workers.__file__, "runtime": workers.runtime.__file__,
                      "django": importlib.util.find_spec("django") is not None,
                      "agent": importlib.util.find_spec("workers.agent") is not None,
                      "prefix": sys.prefix}))
""")


@pytest.fixture
def wheel_cache(settings, tmp_path):
    """A console with no wheel built yet."""
    settings.VAR_DIR = tmp_path / "var"
    return settings.VAR_DIR / "runtime-wheel"


def clean_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH (it would put this checkout's workers/ and the test venv first), nothing of pip's config."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "PIP_NO_INPUT": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def make_clean_venv(where: Path) -> Path:
    """A venv without pip and without system site-packages: only what we install into it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, env=clean_env(),
                   timeout=120)
    python = where / "bin" / "python"
    sys_path = json.loads(subprocess.run([python, "-c", "import sys, json; print(json.dumps(sys.path))"],
                                         capture_output=True, text=True, check=True, env=clean_env()).stdout)
    assert not any("site-packages" in p and not p.startswith(str(where)) for p in sys_path), sys_path
    return python


def pip_install(python: Path, what: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """This test run's pip, installing into the clean venv (`pip --python`), fetching nothing but `what`."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-index", "--no-cache-dir", what], capture_output=True, text=True, env=clean_env(),
                          cwd=cwd, timeout=300)


def test_the_console_builds_the_wheel_once_and_serves_it_without_login(wheel_cache):
    client = Client()  # anonymous
    redirect = client.get("/api/v1/runtime/wheel/")
    assert redirect.status_code == 302
    name = runtime_package.wheel_filename()
    assert name.startswith("gpu_console_runtime-") and name.endswith("-py3-none-any.whl")
    assert redirect["Location"] == f"/api/v1/runtime/{name}"

    response = client.get(redirect["Location"])
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert response["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'
    assert f'filename="{name}"' in response["Content-Disposition"]
    built = list(wheel_cache.glob(f"*/{name}"))
    assert len(built) == 1 and built[0].read_bytes() == body

    names = zipfile.ZipFile(io.BytesIO(body)).namelist()
    code = sorted(n for n in names if not n.startswith("gpu_console_runtime-"))
    assert {n.split("/")[0] for n in code} == {"workers"}
    assert {"workers/__init__.py", "workers/protocol.py", "workers/runtime/reporting.py",
            "workers/runtime/session.py", "workers/runtime/workloads/tiny_lm.py",
            "workers/runtime/data/corpus.txt"} <= set(code)
    # Nothing of the agent, gpuctl or the broker; every runtime source is in it.
    assert not [n for n in code if n.startswith(("workers/agent/", "workers/cli/")) or n == "workers/broker.py"]
    sources = {p.relative_to(REPO).as_posix() for p in (REPO / "workers" / "runtime").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert sources <= set(code)
    metadata = zipfile.ZipFile(io.BytesIO(body)).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not any(word in line.lower() for line in requires for word in ("django", "torch ", "torch>", "celery"))

    # Later requests are served from the cache (no rebuild: the file is the same one), and revalidate.
    mtime = built[0].stat().st_mtime_ns
    again = client.get(f"/api/v1/runtime/{name}", HTTP_IF_NONE_MATCH=response["ETag"])
    assert again.status_code == 304
    assert built[0].stat().st_mtime_ns == mtime
    assert client.get("/api/v1/runtime/gpu_console_runtime-0.0.1-py3-none-any.whl").status_code == 404
    assert client.post("/api/v1/runtime/wheel/").status_code == 405


def test_the_same_sources_give_the_same_wheel_and_concurrent_first_requests_build_it_once(wheel_cache):
    wheels: list[runtime_package.RuntimeWheel] = []
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            wheels.append(runtime_package.runtime_wheel())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len({w.path for w in wheels}) == 1 and len({w.sha256 for w in wheels}) == 1
    first = wheels[0]
    assert not [p for p in wheel_cache.iterdir() if p.name.startswith(".build-")]

    # Built again from scratch (another console, same sources): byte for byte the same wheel.
    for entry in wheel_cache.iterdir():
        if entry.is_dir():
            for file in entry.iterdir():
                file.unlink()
            entry.rmdir()
    assert runtime_package.runtime_wheel().sha256 == first.sha256


def test_a_console_without_the_packaging_sources_says_so(settings, tmp_path):
    settings.BASE_DIR = tmp_path
    settings.VAR_DIR = tmp_path / "var"
    response = Client().get("/api/v1/runtime/wheel/")
    assert response.status_code == 503
    assert "packaging/runtime/pyproject.toml" in response.json()["detail"]


@pytest.mark.slow
def test_pip_installs_the_served_wheel_into_a_clean_venv_where_a_job_reports_progress(live_server, settings,
                                                                                       tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    python = make_clean_venv(tmp_path / "venv")
    name = runtime_package.wheel_filename()
    installed = pip_install(python, f"{live_server.url}/api/v1/runtime/{name}", tmp_path)
    assert installed.returncode == 0, installed.stderr

    progress = tmp_path / "job" / "progress.jsonl"
    script = tmp_path / "job.py"
    script.write_text(IN_JOB)
    run = subprocess.run([python, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env=clean_env(**{ENV_PROGRESS_FILE: str(progress)}))
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["prefix"] == str(tmp_path / "venv")
    assert seen["workers"].startswith(str(tmp_path / "venv" / "lib"))  # the wheel's, not this checkout's
    assert seen["django"] is False and seen["agent"] is False

    records = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [r["type"] for r in records] == [TrainingProgress.TYPE, "result"]
    parsed = TrainingProgress.from_message(records[0])  # what the agent reads back
    assert (parsed.step, parsed.max_steps, parsed.loss) == (3, 10, 0.5)

    # The venv holds the wheel's distribution and nothing else.
    listed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "list", "--format=json"],
                            capture_output=True, text=True, env=clean_env(), check=True, timeout=120)
    assert [d["name"] for d in json.loads(listed.stdout)] == ["gpu-console-runtime"]


def test_the_runtime_sources_parse_as_python_3_10():
    """The wheel says Requires-Python >=3.10 (many CUDA images ship 3.10): no newer syntax in it."""
    files = [REPO / "workers" / "protocol.py", *(REPO / "workers" / "runtime").rglob("*.py")]
    for path in files:
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_the_runtime_imports_only_what_the_wheel_holds():
    """import-linter's forbidden contracts (pyproject.toml) hold: workers.runtime imports no Django, and nothing of
    workers/ that the wheel leaves out."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    forbidden = [c for c in contracts if c["type"] == "forbidden" and "workers.runtime" in c["source_modules"]]
    assert any("django" in c["forbidden_modules"] for c in forbidden)
    assert any({"workers.agent", "workers.cli", "workers.broker"} <= set(c["forbidden_modules"]) for c in forbidden)
    lint = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert lint.returncode == 0 and " 0 broken" in lint.stdout, lint.stdout[-3000:]
