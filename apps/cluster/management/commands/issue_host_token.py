"""Create a host (if new) and issue its agent token. The token is printed or written to a file, once."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand

from apps.cluster.services import host_token_issue


class Command(BaseCommand):
    help = "Issue a new agent token for a host (the previous token stops working)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("host")
        parser.add_argument("--output", help="write the token to this file (mode 0600) instead of printing it")

    def handle(self, *args, host: str, output: str | None, **options) -> None:
        _, secret = host_token_issue(name=host)
        if output:
            path = Path(output)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            os.fchmod(fd, 0o600)  # a file that existed keeps its mode otherwise
            with os.fdopen(fd, "w") as handle:
                handle.write(secret + "\n")
            self.stdout.write(f"Token for host {host} written to {path}")
        else:
            self.stdout.write(secret)
