"""The team's secrets page: its members see the names (jobs name them); managers and admins create, rotate and
delete them. A value is shown once, in the answer to the form that set it (never cached), and never again."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.accounts import access
from apps.accounts import secrets as team_secrets
from apps.accounts.access import Action
from apps.accounts.models import Team, TeamSecret
from apps.core.errors import DomainError
from apps.dashboard.errors import forbidden, form_refusal


def _value_field() -> forms.CharField:
    return forms.CharField(strip=False, widget=forms.Textarea(attrs={"rows": 2, "autocomplete": "off",
                                                                     "spellcheck": "false"}),
                           help_text="Shown once after you save it, never again.")


class SecretCreateForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="Capital letters, digits and underscores, e.g. WANDB_API_KEY.")
    value = _value_field()

    def clean_name(self) -> str:
        if problem := team_secrets.name_problem(self.cleaned_data["name"]):
            raise forms.ValidationError(problem)
        return self.cleaned_data["name"]

    def clean_value(self) -> str:
        if problem := team_secrets.value_problem(self.cleaned_data["value"]):
            raise forms.ValidationError(problem)
        return self.cleaned_data["value"]


class SecretRotateForm(forms.Form):
    value = _value_field()

    def clean_value(self) -> str:
        if problem := team_secrets.value_problem(self.cleaned_data["value"]):
            raise forms.ValidationError(problem)
        return self.cleaned_data["value"]


def _team(request: HttpRequest, slug: str) -> Team:
    return get_object_or_404(access.restrict(Team.objects.all(), request.user), slug=slug)


def _secret(request: HttpRequest, team: Team, name: str) -> TeamSecret:
    return get_object_or_404(team_secrets.secrets_visible_to(request.user, team).select_related("team"), name=name)


def _page(request: HttpRequest, team: Team, *, status: int = 200, shown: tuple[TeamSecret, str] | None = None,
          create_form: SecretCreateForm | None = None, rotate_form: SecretRotateForm | None = None,
          rotate_name: str = "") -> HttpResponse:
    response = render(request, "dashboard/team_secrets.html", {
        "team": team,
        "secrets": team_secrets.secrets_visible_to(request.user, team).select_related("created_by"),
        "may_manage": access.can(request.user, Action.MANAGE_SECRETS, team),
        "create_form": create_form or SecretCreateForm(),
        "rotate_form": rotate_form,
        "rotate_name": rotate_name,
        "shown": shown,
    }, status=status)
    response["Cache-Control"] = "no-store"  # the answer may hold a value
    return response


@login_required
@require_http_methods(["GET", "POST"])
def team_secrets_page(request: HttpRequest, slug: str) -> HttpResponse:
    """GET: the names; POST: create one (managers), answered with its value, once."""
    team = _team(request, slug)
    if request.method == "GET":
        return _page(request, team)
    if not access.can(request.user, Action.MANAGE_SECRETS, team):
        return forbidden(request, access.MESSAGES[Action.MANAGE_SECRETS])
    form = SecretCreateForm(request.POST)
    if not form.is_valid():
        return _page(request, team, status=400, create_form=form)
    try:
        secret = team_secrets.secret_create(team=team, name=form.cleaned_data["name"],
                                            value=form.cleaned_data["value"], actor=request.user, request=request)
    except DomainError as exc:
        form_refusal(form, exc)
        return _page(request, team, status=400, create_form=form)
    return _page(request, team, shown=(secret, form.cleaned_data["value"]))


@login_required
@require_POST
def team_secret_rotate(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    team = _team(request, slug)
    secret = _secret(request, team, name)
    if not access.can(request.user, Action.MANAGE_SECRETS, secret):
        return forbidden(request, access.MESSAGES[Action.MANAGE_SECRETS])
    form = SecretRotateForm(request.POST)
    if not form.is_valid():
        return _page(request, team, status=400, rotate_form=form, rotate_name=name)
    secret = team_secrets.secret_rotate(secret=secret, value=form.cleaned_data["value"], actor=request.user,
                                        request=request)
    return _page(request, team, shown=(secret, form.cleaned_data["value"]))


@login_required
@require_http_methods(["GET", "POST"])
def team_secret_delete(request: HttpRequest, slug: str, name: str) -> HttpResponse:
    """GET: the confirmation; POST: delete."""
    team = _team(request, slug)
    secret = _secret(request, team, name)
    if not access.can(request.user, Action.MANAGE_SECRETS, secret):
        return forbidden(request, access.MESSAGES[Action.MANAGE_SECRETS])
    if request.method == "GET":
        return render(request, "dashboard/team_secret_delete.html", {"team": team, "secret": secret})
    team_secrets.secret_delete(secret=secret, actor=request.user, request=request)
    messages.success(request, f"Secret {name} deleted.")
    return redirect("dashboard:team-secrets", slug=slug)
