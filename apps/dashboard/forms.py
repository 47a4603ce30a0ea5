from __future__ import annotations

import json
import shlex
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.accounts.models import Role
from apps.cluster.selectors import known_gpu_types
from apps.core.parsers import JSONTooDeep, loads_bounded
from apps.jobs.container_spec import MAX_SHM_GB
from apps.jobs.models import MAX_STEPS, Job
from apps.jobs.serializers import JobSubmitSerializer
from apps.jobs.services import JobSpec
from apps.jobs.submission import MAX_ARRAY_SIZE
from apps.jobs.workload_shape import MAX_PARAMS_DEPTH
from apps.quotas.models import Priority
from workers.runtime.catalog import PRESETS, WORKLOADS

User = get_user_model()

WORKLOAD_BUILTIN = "builtin"
WORKLOAD_COMMAND = "command"


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(choices=[("", "any state"), *Job.State.choices], required=False)
    team = forms.ChoiceField(choices=[("", "any team")], required=False)
    user = forms.CharField(required=False, max_length=150, label="User")
    kind = forms.ChoiceField(choices=[("", "any kind"), *Job.Kind.choices], required=False)

    def __init__(self, *args: Any, teams: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [("", "any team")] + [(slug, slug) for slug in teams]


def command_argv(text: str) -> list[str]:
    """A command field: one argument per line, or one line split like a POSIX shell."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    if len(lines) > 1:
        return [line.strip() for line in lines]
    try:
        return shlex.split(lines[0])
    except ValueError as exc:
        raise forms.ValidationError(f"Cannot split the command: {exc}.") from None


def env_lines(text: str) -> dict[str, str]:
    """An environment field: NAME=value lines."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise forms.ValidationError(f"Line {number}: write NAME=value.")
        if name.strip() in env:
            raise forms.ValidationError(f"Line {number}: {name.strip()} is set twice.")
        env[name.strip()] = value
    return env


class JobSubmitForm(forms.Form):
    """What the API's JobSubmitSerializer takes, as form fields. Rules are checked by job_submit."""

    name = forms.CharField(max_length=200)
    team = forms.ChoiceField()
    kind = forms.ChoiceField(choices=Job.Kind.choices, initial=Job.Kind.TRAIN)
    gpus = forms.DecimalField(min_value=Decimal("0.01"), max_value=4096, max_digits=6, decimal_places=2, initial=1,
                              label="GPUs", help_text="Whole GPUs, or a fraction of one GPU (0.25, 0.5) to share it.")
    gpu_memory_gb = forms.FloatField(required=False, label="Memory on the GPU (GiB)",
                                     help_text="Instead of a fraction: the job shares one GPU, its share following "
                                               "from this memory.")
    gpu_type = forms.ChoiceField(required=False, label="GPU type")
    priority = forms.ChoiceField(choices=Priority.choices, initial=Priority.NORMAL)
    preset = forms.ChoiceField(required=False, help_text="Blank: baseline-fp32 for training, infer-fp32 for inference.")
    workload_mode = forms.ChoiceField(
        choices=[(WORKLOAD_BUILTIN, "built-in workload"), (WORKLOAD_COMMAND, "command")],
        initial=WORKLOAD_BUILTIN, widget=forms.RadioSelect, label="Run",
    )
    builtin = forms.ChoiceField(required=False, label="Built-in workload", initial="mlp-digits")
    params = forms.CharField(
        required=False, label="Workload parameters (JSON object)", widget=forms.Textarea(attrs={"rows": 3}),
        help_text='For example {"epochs": 2, "hidden": 128}.',
    )
    command = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3}), label="Command",
        help_text="One argument per line, or a single shell-like line (split like a POSIX shell; no shell runs it).",
    )
    time_limit_minutes = forms.IntegerField(
        required=False, min_value=1, max_value=settings.JOBS_MAX_TIME_LIMIT_MINUTES, label="Time limit (minutes)",
        help_text=f"Blank: {settings.JOBS_DEFAULT_TIME_LIMIT_MINUTES} minutes.",
    )
    max_steps = forms.IntegerField(required=False, min_value=1, max_value=MAX_STEPS, label="Max steps")
    max_retries = forms.IntegerField(min_value=0, max_value=3, initial=0, label="Retries after a lost host")
    array_size = forms.IntegerField(required=False, min_value=1, max_value=MAX_ARRAY_SIZE, label="Array of tasks",
                                    help_text="Blank: one job. N: a job array of N tasks, alike but for their index, "
                                              "which each sees as CONSOLE_ARRAY_TASK_ID (0 to N-1).")
    array_parallelism = forms.IntegerField(required=False, min_value=1, max_value=MAX_ARRAY_SIZE,
                                           label="Array tasks at once",
                                           help_text="Blank: as many as the quota allows. K: at most K of the "
                                                     "array's tasks hold GPUs at once, lowest index first.")
    shareable = forms.BooleanField(required=False, label="Shareable",
                                   help_text="A one-GPU job that may share its GPU with another shareable job when "
                                             "both are measured to leave it mostly idle.")
    cpus = forms.FloatField(required=False, label="CPUs",
                            help_text="CPUs the job may use (may be fractional). Blank: the per-GPU default.")
    memory_gb = forms.FloatField(required=False, label="Host memory (GiB)",
                                 help_text="Past it the job fails as out of memory. Blank: the per-GPU default.")
    # The job's environment (issue 16): checked by job_submit as for the API.
    image = forms.CharField(required=False, strip=True, label="Image",
                            help_text="An OCI image to run in, e.g. registry.example.org/team/train:1.2 (blank: "
                                      "on the host). Only hosts whose agent runs podman or docker take it.")
    env = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}), label="Environment variables",
                          help_text="One NAME=value per line.")
    secrets = forms.CharField(required=False, label="Team secrets",
                              help_text="Names of the team's secrets, separated by spaces or commas (with an "
                                        "image only).")
    mounts = forms.CharField(required=False, label="Volumes",
                             help_text="Names of volumes the team may use, separated by spaces or commas (with an "
                                       "image only).")
    code_snapshot = forms.CharField(required=False, label="Code snapshot",
                                    help_text="The id of an uploaded code snapshot (gpuctl submit --code .).")
    git_url = forms.CharField(required=False, label="Git repository", help_text="https://, ssh:// or git:// URL.")
    git_ref = forms.CharField(required=False, label="Git ref",
                              help_text="Branch, tag or 40-hex commit (blank: HEAD); the commit is recorded.")
    shm_gb = forms.FloatField(required=False, min_value=0.001, max_value=MAX_SHM_GB, label="/dev/shm (GiB)",
                              help_text="Counts against the host memory.")

    def __init__(self, *args: Any, teams: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(slug, slug) for slug in teams]
        if len(teams) == 1:
            self.fields["team"].initial = teams[0]
        self.fields["gpu_type"].choices = [("", "any type")] + [(t, t) for t in sorted(known_gpu_types())]
        self.fields["preset"].choices = [("", "default for the kind")] + [
            (p.name, f"{p.name} ({p.kind})") for p in PRESETS.values()
        ]
        self.fields["builtin"].choices = [("", "—")] + [(w.name, w.name) for w in WORKLOADS.values()]

    def clean_params(self) -> dict[str, Any]:
        text = self.cleaned_data.get("params", "").strip()
        if not text:
            return {}
        try:
            value = loads_bounded(text, MAX_PARAMS_DEPTH)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
        except JSONTooDeep:
            raise forms.ValidationError(f"Nested deeper than {MAX_PARAMS_DEPTH} levels.") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("Give a JSON object, like {\"epochs\": 2}.")
        return value

    def clean_command(self) -> list[str]:
        return command_argv(self.cleaned_data.get("command", ""))

    def clean_env(self) -> dict[str, str]:
        return env_lines(self.cleaned_data.get("env", ""))

    def clean_secrets(self) -> list[str]:
        return _names(self.cleaned_data.get("secrets", ""))

    def clean_mounts(self) -> list[str]:
        return _names(self.cleaned_data.get("mounts", ""))

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        code = self.cleaned_data
        if code.get("code_snapshot") and code.get("git_url"):
            self.add_error("code_snapshot", "Give a code snapshot or a git repository, not both.")
        if code.get("git_ref") and not code.get("git_url"):
            self.add_error("git_url", "Give the repository of the ref.")
        mode = data.get("workload_mode")
        if mode == WORKLOAD_BUILTIN and not data.get("builtin"):
            self.add_error("builtin", "Choose a built-in workload.")
        if mode == WORKLOAD_COMMAND:
            if "command" in data and not data["command"]:
                self.add_error("command", "Give the command to run.")
            if data.get("params"):
                self.add_error("params", "Parameters apply to built-in workloads only.")
        if data is not None and not self.errors:
            self._api_check(data)
        return data

    def _api_check(self, data: dict[str, Any]) -> None:
        """The request the API would get, checked by the API's own serializer (GPU fractions, memory on one GPU,
        CPU and memory bounds, ...): the form takes what the API takes, and refuses it the same way."""
        if data["workload_mode"] == WORKLOAD_BUILTIN:
            workload: dict[str, Any] = {"builtin": data["builtin"], "params": data.get("params") or {}}
        else:
            workload = {"command": data["command"]}
        request: dict[str, Any] = {
            "name": data["name"], "team": data["team"], "kind": data["kind"], "gpus": data["gpus"],
            "gpu_memory_gb": data.get("gpu_memory_gb"), "gpu_type": data.get("gpu_type") or "",
            "priority": data["priority"], "workload": workload, "max_steps": data.get("max_steps"),
            "max_retries": data.get("max_retries") or 0, "cpus": data.get("cpus"), "memory_gb": data.get("memory_gb"),
            "image": data.get("image") or "", "env": data.get("env") or {}, "secrets": data.get("secrets") or [],
            "mounts": data.get("mounts") or [], "shm_gb": data.get("shm_gb"),
        }
        for optional, value in (("preset", data.get("preset")), ("time_limit_minutes", data.get("time_limit_minutes")),
                                ("code", self._code(data)), ("shareable", data.get("shareable")),
                                ("array_size", data.get("array_size")),
                                ("array_parallelism", data.get("array_parallelism"))):
            if value:
                request[optional] = value
        serializer = JobSubmitSerializer(data=request)
        if serializer.is_valid():
            self._spec_fields = serializer.to_spec_fields()
        else:
            self.add_spec_errors(serializer.errors)

    def spec(self) -> JobSpec:
        """The job to submit (after is_valid()): the API's serializer made it from the form's fields."""
        return JobSpec(**self._spec_fields)

    @staticmethod
    def _code(data: dict[str, Any]) -> dict[str, Any] | None:
        if data.get("code_snapshot"):
            return {"snapshot": data["code_snapshot"]}
        if data.get("git_url"):
            return {"git": {"url": data["git_url"], "ref": data.get("git_ref") or "HEAD"}}
        return None

    def add_spec_errors(self, errors: dict[str, object]) -> None:
        """Show job_submit's field errors (JobSpecError.errors) on the form's fields, nested workload errors too."""
        for key, value in errors.items():
            if key == "code" and isinstance(value, dict):
                self._add_code_errors(value)
            elif key == "env" and isinstance(value, dict):
                for name, msgs in value.items():
                    for msg in _as_list(msgs):
                        self.add_error("env", f"{name}: {msg}")
            elif key == "workload" and isinstance(value, dict):
                for sub, messages in value.items():
                    if sub == "params" and isinstance(messages, dict):
                        for param, msgs in messages.items():
                            for msg in _as_list(msgs):
                                self.add_error("params", f"{param}: {msg}")
                    elif sub in ("builtin", "command"):
                        for msg in _as_list(messages):
                            self.add_error(sub, str(msg))
                    else:
                        for msg in _as_list(messages):
                            self.add_error(None, f"workload {sub}: {msg}")
            elif key in self.fields:
                for msg in _as_list(value):
                    self.add_error(key, str(msg))
            else:
                for msg in _as_list(value):
                    self.add_error(None, f"{key}: {msg}")


    def _add_code_errors(self, errors: dict[str, Any]) -> None:
        for kind, value in errors.items():
            if kind == "git" and isinstance(value, dict):
                for sub, msgs in value.items():
                    for msg in _as_list(msgs):
                        self.add_error("git_ref" if sub == "ref" else "git_url", str(msg))
                continue
            for msg in _as_list(value):
                self.add_error("code_snapshot" if kind == "snapshot" else "git_url", str(msg))


def _names(text: str) -> list[str]:
    return [name for name in text.replace(",", " ").split() if name]


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else [value]


class CancelForm(forms.Form):
    reason = forms.CharField(required=False, max_length=300)


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def clean_username(self) -> Any:
        user = User.objects.filter(username=self.cleaned_data["username"], is_active=True).first()
        if user is None:
            raise forms.ValidationError("No active user with this username.")
        return user


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class QuotaRequestForm(forms.Form):
    max_gpus = forms.IntegerField(required=False, min_value=0, max_value=100_000, label="GPUs at once")
    gpu_hours_per_month = forms.DecimalField(
        required=False, min_value=0, max_digits=12, decimal_places=2, label="GPU-hours per month",
        help_text="0 asks for an unlimited budget.",
    )
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("max_gpus") is None and data.get("gpu_hours_per_month") is None and not self.errors:
            raise forms.ValidationError("Ask for more GPUs, more GPU-hours, or both.")
        return data


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    note = forms.CharField(required=False, max_length=500)


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=settings.API_TOKEN_MAX_DAYS, label="Expires in (days)",
        help_text=f"Blank: {settings.API_TOKEN_DEFAULT_DAYS} days.",
    )


class PeriodForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}),
                          help_text="Inclusive.")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("start") and data.get("end") and data["end"] < data["start"]:
            self.add_error("end", "The end is before the start.")
        return data

    def period(self) -> tuple[datetime, datetime]:
        """[start, end) in the current timezone; default: this month so far."""
        now = timezone.localtime()
        data = self.cleaned_data if self.is_valid() else {}
        first: date = data.get("start") or now.date().replace(day=1)
        last: date | None = data.get("end")
        tz = timezone.get_current_timezone()
        start = datetime.combine(first, time.min, tzinfo=tz)
        end = datetime.combine(last + timedelta(days=1), time.min, tzinfo=tz) if last else now
        return start, end


# --- inference services


class ServiceCreateForm(forms.Form):
    """What the API's ServiceCreateSerializer takes, as form fields. Rules are checked by service_create."""

    team = forms.ChoiceField()
    name = forms.SlugField(max_length=49, help_text="Letters, digits and hyphens; part of the endpoint's path.")
    workload = forms.ChoiceField(required=False, label="Built-in workload",
                                 help_text="Blank: the service runs your own server from an image (below).")
    image = forms.CharField(required=False, strip=True, label="Image",
                            help_text="Your server's OCI image; it answers the HTTP contract in docs/containers.md "
                                      "(GET /health, POST /predict on $CONSOLE_SERVE_PORT).")
    command = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Server command",
                              help_text="The server's argv in the image: one argument per line, or a shell-like line.")
    env = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Environment variables",
                          help_text="One NAME=value per line (image services).")
    secrets = forms.CharField(required=False, label="Team secrets",
                              help_text="Names of the team's secrets for the server, separated by spaces or commas.")
    checkpoint = forms.CharField(
        required=False, max_length=300, label="Checkpoint (optional)",
        widget=forms.TextInput(attrs={"placeholder": "JOB_ID/outputs/model.pt"}),
        help_text="Trained weights from a job of the same team, as JOB_ID/outputs/model.pt. Blank: untrained model.",
    )
    preset = forms.ChoiceField(label="Inference preset", initial="infer-fp32")
    gpus_per_replica = forms.IntegerField(min_value=1, max_value=8, initial=1, label="GPUs per replica")
    min_replicas = forms.IntegerField(min_value=0, max_value=64, initial=1, label="Min replicas")
    max_replicas = forms.IntegerField(min_value=1, max_value=64, initial=1, label="Max replicas")
    target_p95_ms = forms.FloatField(required=False, min_value=1, max_value=600_000, label="Target p95 (ms)",
                                     help_text="Blank: no latency target.")
    target_rps_per_replica = forms.FloatField(required=False, min_value=0.01, max_value=1e6,
                                              label="Target req/s per replica",
                                              help_text="Blank: no request-rate target.")
    batching = forms.BooleanField(required=False, initial=True, label="Dynamic batching")
    max_batch = forms.IntegerField(min_value=1, max_value=1024, initial=32, label="Max batch")
    max_wait_ms = forms.FloatField(min_value=0, max_value=1000, initial=5.0, label="Max batching wait (ms)")

    def __init__(self, *args: Any, teams: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(slug, slug) for slug in teams]
        if len(teams) == 1:
            self.fields["team"].initial = teams[0]
        builtins = [(w.name, w.name) for w in WORKLOADS.values() if "inference" in w.kinds]
        self.fields["workload"].choices = [("", "— (an image's server)"), *builtins]
        # Most services serve a built-in model: the first one is preselected (an image's server is the blank choice).
        self.fields["workload"].initial = builtins[0][0] if builtins else ""
        self.fields["preset"].choices = [(p.name, p.name) for p in PRESETS.values() if p.kind == "inference"]

    def clean_checkpoint(self) -> str:
        return self.cleaned_data.get("checkpoint", "").strip()

    def clean_command(self) -> list[str]:
        return command_argv(self.cleaned_data.get("command", ""))

    def clean_env(self) -> dict[str, str]:
        return env_lines(self.cleaned_data.get("env", ""))

    def clean_secrets(self) -> list[str]:
        return _names(self.cleaned_data.get("secrets", ""))

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        low, high = data.get("min_replicas"), data.get("max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("min_replicas", "Min replicas may not exceed max replicas.")
        return data

    def spec_fields(self) -> dict[str, Any]:
        """The ServiceSpec's fields but the team (the view turns the slug into a Team)."""
        data = dict(self.cleaned_data)
        data.pop("team")
        for name in ("command", "env", "secrets"):  # blank: not given (service_create says what is missing)
            data[name] = data.get(name) or None
        return data

    def add_spec_errors(self, errors: dict[str, object]) -> None:
        """service_create's field errors on the form's fields; a variable's own (env: {NAME: [...]}) named."""
        for key, value in errors.items():
            field = key if key in self.fields else None
            items = value.items() if isinstance(value, dict) else [("", value)]
            for name, messages in items:
                for message in _as_list(messages):
                    prefix = "".join(f"{part}: " for part in (None if field else key, name or None) if part)
                    self.add_error(field, f"{prefix}{message}")


class ServiceScaleForm(forms.Form):
    min_replicas = forms.IntegerField(min_value=0, max_value=64, label="Min replicas")
    max_replicas = forms.IntegerField(min_value=1, max_value=64, label="Max replicas")
    target_p95_ms = forms.FloatField(required=False, min_value=1, max_value=600_000, label="Target p95 (ms)",
                                     help_text="Blank: no latency target.")
    target_rps_per_replica = forms.FloatField(required=False, min_value=0.01, max_value=1e6,
                                              label="Target req/s per replica", help_text="Blank: no rate target.")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        low, high = data.get("min_replicas"), data.get("max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("min_replicas", "Min replicas may not exceed max replicas.")
        return data
