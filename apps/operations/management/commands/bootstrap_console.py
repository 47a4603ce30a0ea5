"""Create the demo admin (and a demo team) for `make run`. Safe to run again."""

from __future__ import annotations

import os

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from apps.accounts.models import Role, Team
from apps.accounts.services import ensure_demo_admin, membership_set
from apps.quotas.services import quota_ensure


class Command(BaseCommand):
    help = "Create the demo admin `admin` (password from CONSOLE_ADMIN_PASSWORD or generated) and a demo team."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--demo-team", default="demo", help="slug of a demo team to create ('' for none)")
        parser.add_argument("--demo-gpus", type=int, default=8, help="max_gpus of the demo team")
        parser.add_argument("--agent-host", default="local", help="host name of the local agent ('' for none)")
        parser.add_argument("--agent-token-file", default="var/agent-token", help="where to write its token")

    def handle(self, *args, username: str, demo_team: str, demo_gpus: int, agent_host: str, agent_token_file: str,
               **options) -> None:
        with transaction.atomic():
            user, generated = ensure_demo_admin(username, os.environ.get("CONSOLE_ADMIN_PASSWORD"))
            if demo_team:
                team, created = Team.objects.get_or_create(slug=demo_team, defaults={"name": "Demo team"})
                quota = quota_ensure(team)
                if created:
                    quota.max_gpus = demo_gpus
                    quota.save(update_fields=["max_gpus"])
                    membership_set(team=team, user=user, role=Role.MANAGER, actor=user)
        if agent_host:
            call_command("issue_host_token", agent_host, output=agent_token_file, stdout=self.stdout)
        if generated:
            self.stdout.write(self.style.SUCCESS(f"Demo admin '{username}' created with password: {generated}"))
            self.stdout.write("Set CONSOLE_ADMIN_PASSWORD to choose it yourself next time.")
        elif os.environ.get("CONSOLE_ADMIN_PASSWORD"):
            self.stdout.write(f"Admin '{username}' password set from CONSOLE_ADMIN_PASSWORD.")
        else:
            self.stdout.write(f"Admin '{username}' already exists (its password is unchanged).")
