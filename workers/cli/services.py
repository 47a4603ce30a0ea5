"""`gpuctl service …`: create, list, show, scale and delete inference services."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from workers.cli.errors import EXIT_OK, ApiError, CliError
from workers.cli.output import out, print_json, table
from workers.cli.spec import parse_env


def _connect():
    from workers.cli.main import connect

    return connect()


def _find(api, ref: str) -> dict[str, Any]:
    """A service by id or TEAM/NAME."""
    if ref.isdigit():
        try:
            return api.get(f"services/{ref}/")
        except ApiError as exc:
            if exc.status == 404:
                raise CliError(f"service {ref} not found (or not visible to you)") from None
            raise
    team, _, name = ref.partition("/")
    for service in api.paginate("services/", limit=1000):
        if service["team"] == team and service["name"] == name:
            return service
    raise CliError(f"service {ref} not found: give its id or TEAM/NAME")


def _show(service: dict[str, Any]) -> None:
    stats = service.get("stats") or {}
    serves = (f"{service['image']}: {' '.join(service.get('command') or [])}" if service.get("image")
              else f"{service['workload']} with {service['preset']}")
    out(f"service {service['id']} {service['team']}/{service['name']}: {serves}")
    out(f"  endpoint   POST {service['endpoint']}")
    out(f"  replicas   {stats.get('ready', 0)} ready of {service['desired_replicas']} wanted "
        f"(min {service['min_replicas']}, max {service['max_replicas']})")
    latency = " ".join(f"{k[:-3]} {stats[k]:.0f} ms" for k in ("p50_ms", "p95_ms", "p99_ms") if stats.get(k))
    out(f"  load       {stats.get('rps', 0):.1f} req/s  {latency or 'no traffic yet'}  "
        f"errors {100 * stats.get('error_rate', 0):.1f} %")


def cmd_create(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if args.command_line is not None and argv:
        raise CliError("give the server's command either with --command or after --, not both")
    if args.command_line is not None:
        try:
            argv = shlex.split(args.command_line)
        except ValueError as exc:
            raise CliError(f"--command: {exc}") from None
    if (args.image or argv) and args.workload:
        raise CliError("a service serves either a built-in workload (--workload) or an image's server (--image and "
                       "its command), not both")
    if not (args.image or argv or args.workload):
        raise CliError("what should the service serve? Give --workload NAME, or --image REF with the server's "
                       "command (--command '...' or after --)")
    body: dict[str, Any] = {"team": args.team, "name": args.name, "preset": args.preset,
                            "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
                            "gpus_per_replica": args.gpus, "checkpoint": args.checkpoint or "",
                            "batching": not args.no_batching}
    if args.workload:
        body["workload"] = args.workload
    else:  # the API answers which of image and command is missing
        body["image"] = args.image or ""
        if argv:
            body["command"] = list(argv)
    if args.env:  # with --workload too: the API answers that they are for an image's server
        body["env"] = dict(parse_env(text, os.environ) for text in args.env)
    if args.secret:
        body["secrets"] = list(dict.fromkeys(args.secret))
    if args.target_p95_ms is not None:
        body["target_p95_ms"] = args.target_p95_ms
    if args.target_rps is not None:
        body["target_rps_per_replica"] = args.target_rps
    with _connect() as api:
        service = api.post("services/", body)
    if args.json:
        print_json(service)
    else:
        _show(service)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    with _connect() as api:
        services = list(api.paginate("services/", limit=1000))
    if args.json:
        print_json(services)
        return EXIT_OK
    rows = [[s["id"], f"{s['team']}/{s['name']}", s["workload"] or s.get("image", ""), s["preset"],
             f"{(s.get('stats') or {}).get('ready', 0)}/{s['desired_replicas']}", s["endpoint"]] for s in services]
    out(table(["ID", "SERVICE", "WORKLOAD", "PRESET", "READY", "ENDPOINT"], rows))
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    with _connect() as api:
        service = _find(api, args.service)
    if args.json:
        print_json(service)
    else:
        _show(service)
    return EXIT_OK


def cmd_scale(args: argparse.Namespace) -> int:
    changes = {key: value for key, value in (("min_replicas", args.min_replicas), ("max_replicas", args.max_replicas),
                                            ("target_p95_ms", args.target_p95_ms)) if value is not None}
    if not changes:
        raise CliError("nothing to change: give --min, --max or --target-p95-ms")
    with _connect() as api:
        service = _find(api, args.service)
        service = api.request("PATCH", f"services/{service['id']}/", json=changes)
    _show(service)
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    with _connect() as api:
        service = _find(api, args.service)
        api.request("DELETE", f"services/{service['id']}/")
    out(f"Deleted service {service['team']}/{service['name']}; its replicas are stopping.")
    return EXIT_OK


def add_commands(commands: Any) -> None:
    service = commands.add_parser("service", help="Inference services: create, list, show, scale, delete.")
    actions = service.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create", help="Deploy a built-in workload's model (or a job's checkpoint), or your own server's image.",
        usage="gpuctl service create NAME --team TEAM (--workload NAME | --image REF [--command CMD | -- ARGV...]) "
              "[options]")
    create.set_defaults(func=cmd_create)
    create.add_argument("name")
    create.add_argument("--team", required=True)
    create.add_argument("--workload", help="built-in workload, e.g. mlp-digits")
    create.add_argument("--image", metavar="REF",
                        help="an OCI image whose server the service runs (its command: --command or after --); "
                             "the HTTP contract it answers is in docs/containers.md")
    create.add_argument("--command", dest="command_line", metavar="CMD",
                        help="the server's command in the image, split like a shell would (or give argv after --)")
    create.add_argument("--env", action="append", metavar="NAME=VALUE",
                        help="a variable for the image's server, repeatable; --env NAME passes this shell's value")
    create.add_argument("--secret", action="append", metavar="NAME", help="a team secret the server receives")
    create.add_argument("--checkpoint", help="trained weights: JOB_ID/outputs/model.pt")
    create.add_argument("--preset", default="infer-fp32", help="infer-fp32|infer-fp16|infer-bf16|infer-int8|…")
    create.add_argument("--gpus", type=int, default=1, help="GPUs per replica")
    create.add_argument("--min", dest="min_replicas", type=int, default=1)
    create.add_argument("--max", dest="max_replicas", type=int, default=1)
    create.add_argument("--target-p95-ms", type=float)
    create.add_argument("--target-rps", type=float, help="requests per second per replica")
    create.add_argument("--no-batching", action="store_true")
    create.add_argument("--json", action="store_true")
    create.set_defaults(argv=[])  # the server's argv in the image, after -- (main.parse_args)
    listing = actions.add_parser("list", help="Your teams' services.")
    listing.set_defaults(func=cmd_list)
    listing.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="One service: replicas and live latency.")
    show.set_defaults(func=cmd_show)
    show.add_argument("service", help="id or TEAM/NAME")
    show.add_argument("--json", action="store_true")
    scale = actions.add_parser("scale", help="Change the replica bounds or the latency target.")
    scale.set_defaults(func=cmd_scale)
    scale.add_argument("service", help="id or TEAM/NAME")
    scale.add_argument("--min", dest="min_replicas", type=int)
    scale.add_argument("--max", dest="max_replicas", type=int)
    scale.add_argument("--target-p95-ms", type=float)
    delete = actions.add_parser("delete", help="Stop every replica and remove the service.")
    delete.set_defaults(func=cmd_delete)
    delete.add_argument("service", help="id or TEAM/NAME")
