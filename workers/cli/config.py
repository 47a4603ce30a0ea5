"""Where gpuctl keeps the console's address and the API token.

The file is `$GPUCTL_CONFIG`, else `$XDG_CONFIG_HOME/gpuctl/config.json` (`~/.config/gpuctl/config.json`): JSON,
mode 0600 in a 0700 directory. `GPUCTL_URL` and `GPUCTL_TOKEN` override it (what CI pipelines set).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workers.cli.errors import CliError, UsageError

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_CONFIG = "GPUCTL_CONFIG"
ENV_URL = "GPUCTL_URL"
ENV_TOKEN = "GPUCTL_TOKEN"


@dataclass(frozen=True)
class Config:
    url: str
    token: str | None
    username: str | None = None
    token_id: int | None = None
    token_from_env: bool = False


def config_path() -> Path:
    explicit = os.environ.get(ENV_CONFIG)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "gpuctl" / "config.json"


def normalize_url(url: str) -> str:
    """`https://gpu.lab.example/` -> `https://gpu.lab.example`; refuses anything but an http(s) address."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"'{url}' is not a console address; expected e.g. https://gpu.example.org")
    if parts.query or parts.fragment:
        raise UsageError(f"'{url}': the console address takes no query or fragment")
    return url


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise CliError(f"{path} is not valid JSON; run `gpuctl login` again to rewrite it") from None
    if not isinstance(data, dict):
        raise CliError(f"{path} does not hold a JSON object; run `gpuctl login` again to rewrite it")
    return data


def load_config() -> Config:
    """The stored settings, with GPUCTL_URL / GPUCTL_TOKEN taking precedence."""
    stored = read_config_file(config_path())
    env_url, env_token = os.environ.get(ENV_URL), os.environ.get(ENV_TOKEN)
    url = normalize_url(env_url or stored.get("url") or DEFAULT_URL)
    token = env_token or stored.get("token") or None
    token_id = stored.get("token_id") if not env_token else None
    return Config(
        url=url,
        token=token,
        username=None if env_token else stored.get("username"),
        token_id=token_id if isinstance(token_id, int) else None,
        token_from_env=bool(env_token),
    )


def save_config_file(path: Path, data: dict[str, Any]) -> None:
    """Write atomically with mode 0600; a directory gpuctl creates gets mode 0700."""
    directory = path.parent
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpuctl-", suffix=".tmp")  # created 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def delete_config_file(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
