"""The embedded state (var/: database, broker, tokens) is the console's alone: jobs run under other uids."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_embedded_state_folder_is_made_private_at_start(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    var.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(CONSOLE_VAR_DIR=str(var), DJANGO_SETTINGS_MODULE="console.settings")
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(var.stat().st_mode) == 0o700


def test_a_host_token_file_is_written_0600_even_over_a_readable_one(tmp_path, db):
    from django.core.management import call_command

    token = tmp_path / "agent-token"
    token.write_text("old")
    token.chmod(0o644)
    call_command("issue_host_token", "gpu-x", "--output", str(token))
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text().strip() != "old"
