"""A job's environment beyond GPUs (issue 16): image, env, secrets, mounts, code and /dev/shm, checked by
job_submit for the API, the pages and the CLI alike.

Each check returns the problem for its field (a list of messages, or a dict for a nested field), or None. The
team's secrets and volumes are the accounts and cluster apps' to look up (their InvalidInput names the field).
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apps.accounts.models import Team
from apps.accounts.secrets import validate_secret_names
from apps.cluster.volumes import validate_mount_names
from apps.core.errors import InvalidInput
from apps.jobs.models import CodeSnapshot
from workers.protocol import JOB_ENV_VARIABLES

Problem = list[str] | dict[str, Any]

MAX_IMAGE_LENGTH = 255
MAX_ENV = 100
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_NAMES = 100  # secrets, mounts
MAX_SHM_GB = 1024
MAX_GIT_URL = 2000
MAX_GIT_REF = 255
# `git ls-remote` at submission: the request waits for it.
GIT_LS_REMOTE_TIMEOUT_S = 20

# The OCI reference grammar (github.com/distribution/reference): [registry[:port]/]name[:tag][@sha256:digest].
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?"
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by the agent in every job (its own CONSOLE_* variables, the GPUs it hands the job): a job may not override.
RESERVED_ENV = frozenset({*JOB_ENV_VARIABLES, "NVIDIA_VISIBLE_DEVICES"})
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SCP_LIKE = re.compile(r"[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+")
GIT_SCHEMES = ("https://", "ssh://", "git://")


def image_problem(image: Any) -> Problem | None:
    if not isinstance(image, str):
        return ["Must be an OCI image reference ([registry[:port]/]name[:tag][@sha256:digest])."]
    if len(image) > MAX_IMAGE_LENGTH:
        return [f"At most {MAX_IMAGE_LENGTH} characters."]
    if image and not _IMAGE.fullmatch(image):
        return [f"'{image[:100]}' is no OCI image reference ([registry[:port]/]name[:tag][@sha256:digest]; "
                "lower-case name)."]
    return None


def env_problem(env: Any) -> Problem | None:
    if not isinstance(env, dict):
        return ['Must be an object of NAME: "value".']
    if len(env) > MAX_ENV:
        return [f"At most {MAX_ENV} variables."]
    problems: dict[str, list[str]] = {}
    for name, value in env.items():
        shown = name if "\x00" not in name else repr(name)
        if not _ENV_NAME.fullmatch(name):
            problems[shown] = ["A variable's name is letters, digits and '_', not starting with a digit."]
        elif name.startswith("CONSOLE_") or name in RESERVED_ENV:
            problems[shown] = ["The agent sets this variable (CONSOLE_* and the GPUs' are reserved)."]
        elif not isinstance(value, str):
            problems[shown] = ["Must be a string."]
        elif "\x00" in value:
            problems[shown] = ["Must not contain NUL bytes."]
        elif len(value.encode()) > MAX_ENV_VALUE_BYTES:
            problems[shown] = [f"At most {MAX_ENV_VALUE_BYTES // 1024} KiB."]
    return problems or None


def names_problem(names: Any, what: str) -> Problem | None:
    """A list of distinct names (of secrets or volumes); whether the team has them is asked next."""
    if not isinstance(names, list) or not all(isinstance(name, str) and name for name in names):
        return [f"Must be a list of {what} names."]
    if len(names) > MAX_NAMES:
        return [f"At most {MAX_NAMES} {what}s."]
    if len(set(names)) != len(names):
        return [f"A {what} is named twice."]
    if any("\x00" in name or len(name) > 200 for name in names):
        return [f"A {what} name is at most 200 characters, without NUL bytes."]
    return None


@dataclass(frozen=True)
class Code:
    """A job's code as recorded at submission: a snapshot of the team, or a git repository at a commit."""

    snapshot: CodeSnapshot | None = None
    git_url: str = ""
    git_ref: str = ""
    git_commit: str = ""


def code_of(code: Any, team: Team) -> tuple[Code, Problem | None]:
    """`{"snapshot": ID}` (one of the team's) or `{"git": {"url": URL, "ref": REF}}`, with the commit recorded."""
    if code is None or code == {}:
        return Code(), None
    if not isinstance(code, dict) or len(code) != 1 or not {"snapshot", "git"} & set(code):
        return Code(), ['Give {"snapshot": ID} (an uploaded code snapshot) or {"git": {"url": URL, "ref": REF}}.']
    if "snapshot" in code:
        return _snapshot(code["snapshot"], team)
    return _git(code["git"])


def _snapshot(value: Any, team: Team) -> tuple[Code, Problem | None]:
    try:
        snapshot_id = uuid.UUID(str(value))
    except ValueError:
        return Code(), {"snapshot": ["Must be a code snapshot's id (POST /api/v1/code-snapshots/ answers it)."]}
    snapshot = CodeSnapshot.objects.filter(pk=snapshot_id, team=team).first()
    if snapshot is None:  # another team's snapshot reads as none at all
        return Code(), {"snapshot": [f"Team {team.slug} has no code snapshot {snapshot_id}."]}
    return Code(snapshot=snapshot), None


def _git(value: Any) -> tuple[Code, Problem | None]:
    if not isinstance(value, dict) or set(value) - {"url", "ref"} or not isinstance(value.get("url"), str):
        return Code(), {"git": ['Must be {"url": URL, "ref": BRANCH, TAG OR COMMIT}.']}
    url, ref = value["url"].strip(), value.get("ref", "HEAD")
    if not isinstance(ref, str):
        return Code(), {"git": {"ref": ["Must be a branch, tag or commit."]}}
    ref = ref.strip() or "HEAD"
    if len(url) > MAX_GIT_URL or not (url.startswith(GIT_SCHEMES) or _SCP_LIKE.fullmatch(url)) or any(
            c.isspace() or ord(c) < 32 for c in url):
        return Code(), {"git": {"url": ["Must be an https://, ssh:// or git:// URL (or user@host:path)."]}}
    if len(ref) > MAX_GIT_REF or ref.startswith("-") or any(c.isspace() or ord(c) < 32 for c in ref):
        return Code(), {"git": {"ref": ["Must be a branch, tag or commit (no spaces, not starting with '-')."]}}
    if _COMMIT.fullmatch(ref):  # a commit is its own record: no need to reach the repository
        return Code(git_url=url, git_ref=ref, git_commit=ref), None
    try:
        commit = resolve_ref(url, ref)
    except RefProblem as problem:
        return Code(), {"git": {problem.field: [str(problem)]}}
    return Code(git_url=url, git_ref=ref, git_commit=commit), None


class RefProblem(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def resolve_ref(url: str, ref: str) -> str:
    """The commit `ref` names in the repository at `url` (`git ls-remote`); RefProblem says why there is none."""
    try:
        done = subprocess.run(
            ["git", "ls-remote", "--", url, ref, f"{ref}^{{}}"], capture_output=True, text=True,
            timeout=GIT_LS_REMOTE_TIMEOUT_S, stdin=subprocess.DEVNULL,
            # Never a prompt for a password or a host key: the console answers a request.
            env={"GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": "ssh -o BatchMode=yes", "PATH": "/usr/bin:/bin",
                 "HOME": "/nonexistent"},
        )
    except subprocess.TimeoutExpired:
        raise RefProblem("url", f"The repository did not answer within {GIT_LS_REMOTE_TIMEOUT_S} s; give a 40-hex "
                                "commit as the ref to submit without reaching it.") from None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["git ls-remote failed"])[-1][:200]
        raise RefProblem("url", f"The console could not read the repository ({detail}); give a 40-hex commit as "
                                "the ref to submit without reaching it.")
    refs: dict[str, str] = {}
    for line in done.stdout.splitlines():
        sha, _, name = line.partition("\t")
        if _COMMIT.fullmatch(sha):
            refs[name] = sha
    for name in (f"{ref}^{{}}", ref, f"refs/tags/{ref}^{{}}", f"refs/heads/{ref}", f"refs/tags/{ref}"):
        if name in refs:
            return refs[name]
    raise RefProblem("ref", f"No branch or tag '{ref}' in the repository.")


@dataclass(frozen=True)
class Environment:
    """The checked environment of a job, as job_submit stores it."""

    image: str = ""
    env: dict[str, str] | None = None
    secrets: list[str] | None = None
    mounts: list[str] | None = None
    code: Code = Code()
    shm_gb: float | None = None


def checked_environment(*, image: Any, env: Any, secrets: Any, mounts: Any, code: Any, shm_gb: float | None,
                        team: Team, memory_gb: float, errors: dict[str, object]) -> Environment:
    """The environment as stored, with each field's problem added to `errors` (named by the field)."""
    image = "" if image is None else image
    env = {} if env is None else env
    secrets = [] if secrets is None else secrets
    mounts = [] if mounts is None else mounts
    for name, problem in (("image", image_problem(image)), ("env", env_problem(env)),
                          ("secrets", names_problem(secrets, "secret")), ("mounts", names_problem(mounts, "volume"))):
        if problem is not None:
            errors[name] = problem
    if "secrets" not in errors and secrets:
        _ask(lambda: validate_secret_names(team.pk, secrets), "secrets", errors)
    if "env" not in errors and "secrets" not in errors and (both := sorted(set(env) & set(secrets))):
        errors["env"] = {name: ["Also a secret the job names: the secret sets it."] for name in both}
    if "mounts" not in errors and mounts:
        _ask(lambda: validate_mount_names(team.pk, mounts), "mounts", errors)
    # A job without an image runs as processes on the host: it gets its env and code there, and its secrets and
    # volumes only from an agent that runs it under a uid of its own (placement: apps/scheduling/host_needs.py,
    # OWN_UID), the volumes bound in its filesystem view.
    if shm_gb is not None:
        if not image:
            errors["shm_gb"] = ["Sizes a container's /dev/shm: give an image too."]
        elif not 0 < shm_gb <= min(MAX_SHM_GB, memory_gb):
            errors["shm_gb"] = [f"Must be above 0 and at most the job's memory ({memory_gb:g} GB): /dev/shm is "
                                "memory."]
    checked_code, problem = code_of(code, team)
    if problem is not None:
        errors["code"] = problem
    return Environment(image=image, env=env, secrets=secrets, mounts=mounts, code=checked_code, shm_gb=shm_gb)


def _ask(check: Callable[[], None], field: str, errors: dict[str, object]) -> None:
    """Run another app's check; its InvalidInput names the field (only that field is taken from it)."""
    try:
        check()
    except InvalidInput as refusal:
        errors[field] = refusal.errors.get(field) or [str(refusal)]
