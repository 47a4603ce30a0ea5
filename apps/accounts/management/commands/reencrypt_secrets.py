"""Encrypt every team secret again with the first key of CONSOLE_SECRETS_KEY (key rotation, docs/operations.md)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps.accounts.secrets import secrets_reencrypt


class Command(BaseCommand):
    help = ("Re-encrypt every team secret with the first key of CONSOLE_SECRETS_KEY; run it after putting a new key "
            "first and before removing the old one.")

    def handle(self, *args, **options) -> None:
        done, unreadable = secrets_reencrypt()
        self.stdout.write(f"{done} secret(s) re-encrypted with the first key.")
        if unreadable:
            raise CommandError(f"no key of CONSOLE_SECRETS_KEY opens {', '.join(unreadable)}: keep the key that "
                               "encrypted them in the list, or have the teams' managers set them again")
