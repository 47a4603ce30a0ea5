"""gpuctl's commands and argument parsing. `main(argv)` returns the exit status."""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from workers.cli import code, services, team_secrets
from workers.cli.client import Api
from workers.cli.config import (
    DEFAULT_URL,
    ENV_TOKEN,
    ENV_URL,
    config_path,
    delete_config_file,
    load_config,
    normalize_url,
    read_config_file,
    save_config_file,
)
from workers.cli.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    ApiError,
    CliError,
    UsageError,
)
from workers.cli.follow import FINAL_STATES, LogStream, fetch_job, follow_log, job_exit_code, wait_for_job
from workers.cli.output import err, job_detail, job_rows, out, print_json, shorten, state_note, table
from workers.cli.spec import build_spec, load_spec_file
from workers.codepack import human_size
from workers.protocol import CODE_PATH, CODE_SNAPSHOT_MAX_BYTES

JOB_STATES = ("queued", "placed", "running", "succeeded", "failed", "cancelled", "preempted")
PRIORITIES = ("low", "normal", "high", "urgent")
DEFAULT_INTERVAL_S = 2.0

Command = Callable[[argparse.Namespace], int]


# --- helpers


def connect() -> Api:
    """An API client for the configured console, or a clear error when there is no token."""
    config = load_config()
    if not config.token:
        raise CliError(
            f"not logged in: run `gpuctl login --url {config.url}` (or set {ENV_URL} and {ENV_TOKEN}); "
            f"settings are read from {config_path()}"
        )
    return Api(config.url, config.token)


def _is_loopback(url: str) -> bool:
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "127.0.0.1", "::1") or host.endswith(".localhost")


def _read_line(prompt: str) -> str:
    sys.stderr.write(prompt)
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        raise UsageError("no input (end of file)")
    return line.strip()


# --- login / logout


def cmd_login(args: argparse.Namespace) -> int:
    path = config_path()
    try:
        stored = read_config_file(path)
    except CliError:
        stored = {}  # a damaged file is about to be replaced
    url = normalize_url(args.url or os.environ.get(ENV_URL) or stored.get("url") or DEFAULT_URL)
    if args.password_stdin and not args.username:
        raise UsageError("--password-stdin reads the password from stdin, so give the user with --username")
    username = args.username or _read_line(f"Username for {url}: ")
    if args.password_stdin:
        password = sys.stdin.read().rstrip("\r\n")
    else:
        password = getpass.getpass(f"Password for {username} at {url}: ")
    if not username or not password:
        raise UsageError("a username and a password are needed")
    if url.startswith("http://") and not _is_loopback(url):
        err(f"warning: {url} is not HTTPS: the password and the token travel unencrypted")
    body: dict[str, Any] = {
        "username": username,
        "password": password,
        "name": args.token_name or f"gpuctl@{socket.gethostname()}"[:100],
    }
    if args.expires_in_days:
        body["expires_in_days"] = args.expires_in_days
    with Api(url) as api:
        try:
            answer = api.post("auth/token/", body)
        except ApiError as exc:
            if exc.status == 400:
                raise CliError(exc.message.replace("the console refused the request", "login failed"),
                               EXIT_USAGE) from None
            raise
    token = answer.get("token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token:
        raise CliError(f"{api.endpoint('auth/token/')} did not return a token")
    save_config_file(path, {
        "url": url,
        "username": username,
        "token": token,
        "token_id": answer.get("id"),
        "token_name": answer.get("name", body["name"]),
        "expires_at": answer.get("expires_at"),
    })
    expiry = f", expires {answer['expires_at']}" if answer.get("expires_at") else ""
    message = f"Logged in to {url} as {username}: token '{body['name']}'{expiry} saved to {path}"
    if args.show_token:
        err(message)
        out(token)  # alone on stdout, for TOKEN=$(gpuctl login --show-token ...)
    else:
        out(message)
    if os.environ.get(ENV_TOKEN):
        err(f"note: {ENV_TOKEN} is set and takes precedence over the saved token")
    return EXIT_OK


def cmd_logout(args: argparse.Namespace) -> int:
    path = config_path()
    config = load_config()
    if config.token and config.token_id is not None and not config.token_from_env:
        try:
            with Api(config.url, config.token) as api:
                api.post(f"tokens/{config.token_id}/revoke/")
        except CliError as exc:
            err(f"warning: could not revoke the token at {config.url}: {exc.message}")
    removed = delete_config_file(path)
    out(f"Logged out: removed {path}" if removed else f"Not logged in ({path} does not exist)")
    return EXIT_OK


# --- jobs


def cmd_submit(args: argparse.Namespace) -> int:
    base = load_spec_file(args.file) if args.file else {}
    fields = {
        "name": args.name, "team": args.team, "kind": args.kind, "gpus": args.gpus, "gpu_type": args.gpu_type,
        "priority": args.priority, "preset": args.preset, "max_steps": args.max_steps,
        "time_limit_minutes": args.time_limit, "max_retries": args.max_retries, "cpus": args.cpus,
        "memory_gb": args.memory_gb, "image": args.image, "shm_gb": args.shm_gb,
        "shareable": True if args.shareable else None,
        "array_size": args.array[0] if args.array else None, "array_parallelism": args.array[1] if args.array else None,
    }
    spec = build_spec(base, fields, builtin=args.builtin, params=args.param, command=args.command_line,
                      argv=args.argv, env=args.env, secrets=args.secret, mounts=args.mount, code_dir=args.code,
                      git=args.git, environ=os.environ)
    if "workload" not in spec:
        raise UsageError("what should the job run? Give --builtin NAME (see `gpuctl workloads`), "
                         "--command '...', -- ARGV..., or a workload in the -f file")
    folder = spec.get("code") if isinstance(spec.get("code"), str) else None
    if args.dry_run:
        if folder is not None:
            with code.pack_folder(folder) as packed:
                spec["code"] = {"snapshot": f"(not uploaded: sha256 {packed.sha256})"}
        print_json(spec)
        return EXIT_OK
    with connect() as api:
        if folder is not None:
            with code.pack_folder(folder, quiet=args.quiet) as packed:
                spec["team"] = code.resolve_team(api, spec.get("team"), "which team's job is this?")
                snapshot = code.upload(api, packed, spec["team"], quiet=args.quiet)
            spec["code"] = {"snapshot": snapshot["id"]}
        job = api.post("jobs/", spec)
        if job.get("array_job_ids"):
            return _submitted_array(api, job, args)
        if args.quiet:
            out(str(job["id"]))
        elif not args.json:
            note = state_note(job)
            out(f"Submitted job {job['id']} ({job.get('name')}, team {job.get('team')}): {job['state']}"
                + (f" - {note}" if note else ""))
        elif not args.wait:
            print_json(job)
        if not args.wait:
            return EXIT_OK
        final = _wait(api, job["id"], interval=args.interval, show_logs=not args.no_logs,
                      log_to_stderr=args.json)
        if final is None:
            return EXIT_INTERRUPTED
        if args.json:
            print_json(final)
        return job_exit_code(final)


def _submitted_array(api: Api, first: dict[str, Any], args: argparse.Namespace) -> int:
    """Say what a job array queued; with --wait follow every task's state to its end (no logs: they run side by
    side) and exit with the highest of their statuses (sbatch --wait's way), 0 if all succeeded."""
    ids: list[int] = first["array_job_ids"]
    if args.quiet:
        out(str(first["id"]))
    elif not args.json:
        out(f"Submitted job array {first['id']} ({first.get('name')}, team {first.get('team')}): {len(ids)} tasks, "
            f"jobs {_id_ranges(ids)}")
    elif not args.wait:
        print_json(first)
    if not args.wait:
        return EXIT_OK
    finals = []
    for job_id in ids:
        final = _wait(api, job_id, interval=args.interval, show_logs=False, log_to_stderr=True)
        if final is None:
            return EXIT_INTERRUPTED
        finals.append(final)
    if args.json:
        print_json(finals)
    return max(map(job_exit_code, finals))


def _id_ranges(ids: list[int]) -> str:
    """`12-15,19`: job ids as runs of consecutive numbers."""
    runs: list[list[int]] = []
    for job_id in sorted(ids):
        if runs and job_id == runs[-1][1] + 1:
            runs[-1][1] = job_id
        else:
            runs.append([job_id, job_id])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _wait(api: Api, job_id: int, *, interval: float, show_logs: bool, log_to_stderr: bool) -> dict[str, Any] | None:
    """Follow the job to its end; None if the user pressed Ctrl-C (the job is left alone)."""
    logs = LogStream(api, job_id, sys.stderr if log_to_stderr else None) if show_logs else None
    try:
        job = wait_for_job(api, job_id, interval=interval, logs=logs)
    except KeyboardInterrupt:
        _stopped_following(job_id)
        return None
    err(f"[gpuctl] job {job_id} {job['state']}: exiting with status {job_exit_code(job)}")
    return job


def _stopped_following(job_id: int) -> None:
    err(f"\n[gpuctl] stopped following job {job_id}; the job was NOT cancelled and keeps its place.\n"
        f"  follow it again: gpuctl logs {job_id} --follow\n"
        f"  cancel it:       gpuctl cancel {job_id}")


def cmd_status(args: argparse.Namespace) -> int:
    with connect() as api:
        if args.job_id is not None:
            if args.state or args.team or args.user or args.kind or args.array:
                raise UsageError("--state, --team, --user, --kind and --array filter the job list; drop them or the "
                                 "JOB_ID")
            job = fetch_job(api, args.job_id)
            print_json(job) if args.json else out(job_detail(job))
            return EXIT_OK
        if args.array is not None:  # every task, by index (squeue lists them all)
            array_id, size = _array_of(api, args.array)
            jobs = sorted(api.paginate("jobs/", limit=size, state=args.state, team=args.team, user=args.user,
                                       kind=args.kind, array=array_id), key=lambda job: job.get("array_index") or 0)
        else:
            jobs = list(api.paginate("jobs/", limit=args.limit, state=args.state, team=args.team, user=args.user,
                                     kind=args.kind))
    if args.json:
        print_json(jobs)
    elif jobs:
        out(job_rows(jobs))
    else:
        err("No jobs.")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    with connect() as api:
        try:
            follow_log(api, args.job_id, interval=args.interval, follow=args.follow)
        except KeyboardInterrupt:
            _stopped_following(args.job_id)
            return EXIT_INTERRUPTED
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    if args.array:
        return _cancel_array(args)
    with connect() as api:
        try:
            job = api.post(f"jobs/{args.job_id}/cancel/", {"reason": args.reason or ""})
        except ApiError as exc:
            if exc.status == 404:
                raise CliError(f"job {args.job_id} not found (or not visible to you) at {api.url}") from None
            if exc.status == 409:
                raise CliError(f"job {args.job_id} cannot be cancelled: {exc.message}") from None
            raise
    if args.json:
        print_json(job)
    else:
        out(f"Cancelled job {job['id']} ({job.get('name')}): {job['state']}")
    return EXIT_OK


def _array_of(api: Api, job_id: int) -> tuple[int, int]:
    """(the array's id, its number of tasks) of job `job_id`, a job array or any task of it."""
    job = fetch_job(api, job_id)
    if job.get("array_id") is None:
        raise CliError(f"job {job_id} is not a task of a job array")
    return int(job["array_id"]), int(job.get("array_size") or 1)


def _cancel_array(args: argparse.Namespace) -> int:
    """Cancel every task of the job array that JOB_ID is (or is a task of) that has not ended. A task that ends
    meanwhile is no failure (scancel's way); a refusal is."""
    with connect() as api:
        array_id, size = _array_of(api, args.job_id)
        tasks = list(api.paginate("jobs/", limit=size, array=array_id))
        live = [job["id"] for job in tasks if job.get("state") not in FINAL_STATES]
        answer = api.post("jobs/cancel/", {"ids": live, "reason": args.reason or ""}) if live else {
            "cancelled": 0, "refused": 0, "results": []}
    refused = [r for r in answer["results"] if not r.get("cancelled") and r.get("status") != 409]
    if args.json:
        print_json(answer)
    else:
        ended = len(tasks) - answer["cancelled"] - len(refused)
        out(f"Cancelled {answer['cancelled']} of the {len(tasks)} tasks of job array {array_id}"
            + (f" ({ended} had ended)" if ended else "")
            + (f"; {len(refused)} refused: {refused[0].get('detail')}" if refused else ""))
    return EXIT_FAILURE if refused else EXIT_OK


# --- catalogue


def cmd_presets(args: argparse.Namespace) -> int:
    with connect() as api:
        presets = api.get("presets/")
    if args.json:
        print_json(presets)
        return EXIT_OK
    rows = []
    for preset in presets:
        needs = [label for key, label in (("needs_gpu", "gpu"), ("multi_process", "multi-process")) if preset.get(key)]
        rows.append([preset.get("name"), preset.get("kind"), ",".join(needs) or "-",
                     shorten(preset.get("description", ""), 90)])
    out(table(["NAME", "KIND", "NEEDS", "DESCRIPTION"], rows))
    return EXIT_OK


def cmd_workloads(args: argparse.Namespace) -> int:
    with connect() as api:
        workloads = api.get("workloads/")
    if args.json:
        print_json(workloads)
        return EXIT_OK
    blocks = []
    for workload in workloads:
        params = workload.get("params") or {}
        lines = [f"{workload.get('name')}  ({', '.join(workload.get('kinds', []))})",
                 f"  {workload.get('description', '')}"]
        if params:
            lines.append("  params: " + ", ".join(
                f"{name} ({spec.get('type')}, default {spec.get('default')!r})" for name, spec in params.items()
            ))
        blocks.append("\n".join(lines))
    out("\n\n".join(blocks))
    out("\nSet params with: gpuctl submit --builtin NAME --param KEY=VALUE ...")
    return EXIT_OK


# --- parser


def _positive_int(what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of at least 1, refused naming `what` it is."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} is a number, not {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{what} is a positive number")
        return value

    return parse


_job_id = _positive_int("a job id")


def _array(text: str) -> tuple[int, int | None]:
    """--array N or N%K: (tasks, at most this many at once or None)."""
    size, percent, parallel = text.partition("%")
    tasks = _positive_int("the number of an array's tasks")(size)
    if not percent:
        return tasks, None
    return tasks, _positive_int("the number of an array's tasks at once (after %)")(parallel)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-console")
    except PackageNotFoundError:
        return "unknown"


EPILOG = f"""\
settings: `gpuctl login` saves the console's address and an API token in $GPUCTL_CONFIG
(default ~/.config/gpuctl/config.json). In CI set {ENV_URL} and {ENV_TOKEN} instead; they win over the file.

exit status: 0 ok; 1 error; 2 bad usage or a request the console refused (field errors on stderr);
submit --wait: the job's exit code (0 succeeded, 1 failed without a code, 130 cancelled or Ctrl-C).
"""


SUBMIT_EPILOG = """\
spec file (-f job.yaml, or JSON): a mapping whose keys are the API's job fields; flags override them,
--env adds to (and wins over) its env, --secret and --mount add to its lists, --code/--git replace its code.
  name: train-resnet
  team: vision
  gpus: 2
  gpu_type: H200                  # optional
  kind: train                     # or inference
  priority: normal                # low | normal | high | urgent
  preset: ddp                     # see `gpuctl presets`
  workload:                       # either a command ...
    command: [python, train.py, --epochs, "3"]
  # workload: {builtin: tiny-lm, params: {epochs: 2}}   # ... or a built-in workload
  image: localhost/team/train:2   # an OCI image; without one the job runs on the host
  env: {WANDB_PROJECT: resnet, EPOCHS: 3}
  secrets: [WANDB_API_KEY]        # team secrets, by name
  mounts: [imagenet]              # volumes the admins defined, by name
  code: .                         # a folder to pack and upload, relative to this file;
  # code: {git: {url: https://git.example.org/vision/resnet.git, ref: main}}
  # code: {snapshot: SNAPSHOT_ID}  # one uploaded before
  shm_gb: 8
  cpus: 8
  memory_gb: 64
  time_limit_minutes: 240
  max_retries: 1
  max_steps: 10000
  array_size: 8                   # a job array: 8 tasks, each told its index ($CONSOLE_ARRAY_TASK_ID)

examples:
  gpuctl submit --image localhost/train:2 --code . --gpus 1 --env EPOCHS=3 --secret WANDB_API_KEY \\
      -- python train.py
  gpuctl submit -f job.yaml --gpus 4 --wait
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuctl", description="Submit and follow jobs on the GPU cluster console.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuctl {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, func: Command, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text, **kwargs)
        sub.set_defaults(func=func)
        return sub

    login = command("login", cmd_login, "Get an API token and save it with the console's address.")
    login.add_argument("--url", help=f"the console's address (default: ${ENV_URL}, the saved one, or "
                                     f"{DEFAULT_URL})")
    login.add_argument("--username", "-u")
    login.add_argument("--password-stdin", action="store_true", help="read the password from stdin (no prompt)")
    login.add_argument("--token-name", help="a name for the token (default: gpuctl@HOSTNAME)")
    login.add_argument("--expires-in-days", type=int, help="token lifetime (default: the console's)")
    login.add_argument("--show-token", action="store_true", help="print the new token on stdout (once)")

    command("logout", cmd_logout, "Revoke the saved token and delete the settings file.")

    submit = command(
        "submit", cmd_submit, "Submit a job from flags and/or a spec file.",
        usage="gpuctl submit [-f SPEC] [options] [--builtin NAME [--param K=V ...] | --command CMD | -- ARGV...]",
        epilog=SUBMIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument("-f", "--file", help="a YAML or JSON job spec with the API's field names ('-' = stdin); "
                                             "flags override its fields")
    submit.add_argument("--name")
    submit.add_argument("--team", help="team slug (needed if you belong to several)")
    submit.add_argument("--kind", choices=("train", "inference"))
    submit.add_argument("--gpus", type=int)
    submit.add_argument("--gpu-type", help="e.g. H200")
    submit.add_argument("--priority", choices=PRIORITIES)
    submit.add_argument("--preset", help="optimization preset (see `gpuctl presets`)")
    submit.add_argument("--builtin", metavar="NAME", help="a built-in workload (see `gpuctl workloads`)")
    submit.add_argument("--param", action="append", metavar="KEY=VALUE",
                        help="a builtin workload parameter, repeatable; VALUE is read as JSON when it parses")
    submit.add_argument("--command", dest="command_line", metavar="CMD",
                        help="a command to run, split like a shell would (or give argv after --)")
    submit.add_argument("--max-steps", type=int)
    submit.add_argument("--time-limit", type=int, metavar="MINUTES")
    submit.add_argument("--max-retries", type=int)
    submit.add_argument("--array", type=_array, metavar="N[%%K]",
                        help="a job array: N tasks, alike but for their index, which each sees as "
                             "$CONSOLE_ARRAY_TASK_ID (0 to N-1), at most K of them at once (Slurm's --array)")
    submit.add_argument("--shareable", action="store_true",
                        help="a one-GPU job that may share its GPU with another shareable job when both are "
                             "measured to leave it mostly idle")
    submit.add_argument("--cpus", type=_positive_float, metavar="N",
                        help="CPUs the job may use, may be fractional (default: a number per GPU the admins set)")
    submit.add_argument("--memory-gb", type=_positive_float, metavar="GB",
                        help="host memory the job may use; past it the job fails as out of memory")
    environment = submit.add_argument_group("environment (OCI image, variables, secrets, data, code)")
    environment.add_argument("--image", metavar="REF",
                             help="run in this OCI image, e.g. registry.example.org/team/train:2 (default: on the "
                                  "host, with the agent's Python)")
    environment.add_argument("--env", action="append", metavar="NAME=VALUE",
                             help="a variable for the job, repeatable; --env NAME passes this shell's value")
    environment.add_argument("--secret", action="append", metavar="NAME",
                             help="a team secret the job receives, repeatable (see `gpuctl secret list`)")
    environment.add_argument("--mount", action="append", metavar="NAME",
                             help="a volume the admins defined, repeatable; it appears at /mnt/NAME unless they "
                                  "chose another path")
    environment.add_argument("--shm-gb", type=_positive_float, metavar="GB",
                             help="size of /dev/shm in the container (PyTorch's DataLoader workers use it)")
    source = environment.add_mutually_exclusive_group()
    source.add_argument("--code", metavar="DIR",
                        help=f"pack DIR (honouring .gitignore and .consoleignore; at most "
                             f"{human_size(CODE_SNAPSHOT_MAX_BYTES)} compressed), upload it, and start the job in it "
                             f"({CODE_PATH})")
    source.add_argument("--git", metavar="URL[@REF]",
                        help="start the job in a checkout of this repository at REF (a branch, tag or commit; "
                             "default: its default branch); the commit is recorded")
    submit.add_argument("--wait", action="store_true",
                        help="stream the log and state changes until the job ends; exit with its exit code")
    submit.add_argument("--no-logs", action="store_true", help="with --wait: follow the state only")
    submit.add_argument("--interval", type=_positive_float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                        help=f"with --wait: seconds between polls (default {DEFAULT_INTERVAL_S:g})")
    submit.add_argument("--dry-run", action="store_true", help="print the spec that would be sent, send nothing")
    output = submit.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true",
                        help="print the job as JSON (with --wait: the final job; the log goes to stderr)")
    output.add_argument("-q", "--quiet", action="store_true", help="print only the job id")
    submit.set_defaults(argv=[])

    status = command("status", cmd_status, "One job's details, or a table of jobs.")
    status.add_argument("job_id", nargs="?", type=_job_id, metavar="JOB_ID")
    status.add_argument("--state", action="append", choices=JOB_STATES, help="repeatable")
    status.add_argument("--team")
    status.add_argument("--user")
    status.add_argument("--kind", choices=("train", "inference"))
    status.add_argument("--array", type=_job_id, metavar="JOB_ID",
                        help="every task of the job array this job is (or is a task of), by index")
    status.add_argument("--limit", type=int, default=50, help="at most this many jobs, newest first (default 50)")
    status.add_argument("--json", action="store_true")

    logs = command("logs", cmd_logs, "Print a job's log.")
    logs.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    logs.add_argument("--interval", type=_positive_float, default=DEFAULT_INTERVAL_S, metavar="SECONDS")

    cancel = command("cancel", cmd_cancel, "Cancel a job.")
    cancel.add_argument("job_id", type=_job_id, metavar="JOB_ID")
    cancel.add_argument("--array", action="store_true",
                        help="cancel every task of the job array JOB_ID is (or is a task of) that has not ended")
    cancel.add_argument("--reason", help="recorded in the job's events")
    cancel.add_argument("--json", action="store_true")

    presets = command("presets", cmd_presets, "The optimization presets a job may name.")
    presets.add_argument("--json", action="store_true")
    workloads = command("workloads", cmd_workloads, "The built-in workloads and their parameters.")
    workloads.add_argument("--json", action="store_true")
    services.add_commands(commands)
    team_secrets.add_commands(commands)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Like parse_args, but `submit ... -- ARGV...` keeps ARGV (options included) as the job's command, and
    `service create ... -- ARGV...` as the service's server command."""
    argv = list(argv)
    if "--" in argv:
        split = argv.index("--")
        args = parser.parse_args(argv[:split])
        if args.command == "submit" or (args.command == "service" and args.service_command == "create"):
            args.argv = argv[split + 1:]
            if not args.argv:
                parser.error("nothing after --: give the command to run")
            return args
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parse_args(parser, sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.func(args)
        return code
    except CliError as exc:
        err(f"gpuctl: error: {exc.message}")
        return exc.exit_code
    except KeyboardInterrupt:
        err("\ngpuctl: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `gpuctl status | head`
        _silence_stdout()
        return EXIT_OK


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
