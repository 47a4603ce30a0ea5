"""`gpuctl secret …`: list, create, rotate and delete a team's secrets.

A value never comes from the command line (it would sit in the shell's history and in `ps`): it is read from
--from-file, from stdin when stdin is not a terminal, or from a hidden prompt.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any
from urllib.parse import quote

from workers.cli.client import Api
from workers.cli.code import resolve_team
from workers.cli.errors import EXIT_OK, UsageError
from workers.cli.output import err, out, print_json, table, when


def _connect() -> Api:
    from workers.cli.main import connect  # main imports this module

    return connect()


def _base(api: Api, team: str | None) -> tuple[str, str]:
    slug = resolve_team(api, team, "which team's secrets?")
    return slug, f"teams/{quote(slug, safe='')}/secrets/"


def read_value(source: str | None, name: str) -> str:
    """The secret's value: a file's exact contents, or stdin / the prompt without the one line end typed."""
    if source is not None and source != "-":
        try:
            with open(source, encoding="utf-8", newline="") as fh:
                value = fh.read()
        except OSError as exc:
            raise UsageError(f"--from-file {source}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--from-file {source}: a secret's value is text (UTF-8)") from None
    elif source == "-" or not sys.stdin.isatty():
        value = sys.stdin.read()
        value = value.removesuffix("\n").removesuffix("\r")
    else:
        value = getpass.getpass(f"Value of secret {name} (not shown): ")
    if not value:
        raise UsageError(f"the value of secret {name} is empty")
    return value


def cmd_list(args: argparse.Namespace) -> int:
    with _connect() as api:
        slug, base = _base(api, args.team)
        body = api.get(base)
    items: list[dict[str, Any]] = body.get("results", []) if isinstance(body, dict) else list(body or [])
    if args.json:
        print_json(items)
    elif items:
        out(table(["NAME", "VERSION", "CREATED", "BY", "ROTATED"],
                  [[item.get("name"), item.get("version", "-"), when(item.get("created_at")),
                    item.get("created_by") or "-", when(item.get("rotated_at"))] for item in items]))
    else:
        err(f"Team {slug} has no secrets.")
    return EXIT_OK


def cmd_create(args: argparse.Namespace) -> int:
    value = read_value(args.from_file, args.name)
    with _connect() as api:
        slug, base = _base(api, args.team)
        api.post(base, {"name": args.name, "value": value})
    out(f"Created secret {args.name} in team {slug}; a job receives it with --secret {args.name}")
    return EXIT_OK


def cmd_rotate(args: argparse.Namespace) -> int:
    value = read_value(args.from_file, args.name)
    with _connect() as api:
        slug, base = _base(api, args.team)
        api.put(f"{base}{quote(args.name, safe='')}/", {"value": value})
    out(f"Rotated secret {args.name} of team {slug}: jobs that start from now on receive the new value")
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    with _connect() as api:
        slug, base = _base(api, args.team)
        api.delete(f"{base}{quote(args.name, safe='')}/")
    out(f"Deleted secret {args.name} of team {slug}")
    return EXIT_OK


def add_commands(commands: Any) -> None:
    secret = commands.add_parser(
        "secret", help="A team's secrets (API keys, tokens) that jobs receive by name.",
        description="A team's secrets: managers create, rotate and delete them; jobs receive them with "
                    "`gpuctl submit --secret NAME`. Values are read from --from-file, from stdin, or from a "
                    "hidden prompt, never from the command line. From stdin or the prompt the final line end is "
                    "dropped; a file's contents are taken as they are.",
    )
    actions = secret.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = actions.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(func=func)
        sub.add_argument("--team", help="team slug (needed if you belong to several)")
        return sub

    listing = action("list", cmd_list, "The team's secrets (names and dates; values are never shown).")
    listing.add_argument("--json", action="store_true")
    for name, func, help_text in (("create", cmd_create, "Create a secret."),
                                  ("rotate", cmd_rotate, "Give a secret a new value.")):
        sub = action(name, func, help_text)
        sub.add_argument("name", metavar="NAME")
        sub.add_argument("--from-file", metavar="PATH", help="read the value from this file ('-' = stdin)")
    delete = action("delete", cmd_delete, "Delete a secret.")
    delete.add_argument("name", metavar="NAME")
