from django.contrib import admin, messages

from apps.accounts.admin import MembershipInline, TeamAdmin
from apps.accounts.models import Team
from apps.quotas.models import QuotaRequest, TeamQuota, UserQuota
from apps.quotas.services import QuotaRequestError, quota_audit_changes, quota_request_decide, quota_snapshot


class TeamQuotaInline(admin.StackedInline):
    model = TeamQuota
    can_delete = False


class UserQuotaInline(admin.TabularInline):
    model = UserQuota
    extra = 0
    autocomplete_fields = ["user"]


# The team's page shows its quotas: the accounts app cannot name them (quotas sit above it), so it is registered
# again here with them.
admin.site.unregister(Team)


@admin.register(Team)
class TeamWithQuotasAdmin(TeamAdmin):
    inlines = [TeamQuotaInline, UserQuotaInline, MembershipInline]


@admin.register(TeamQuota)
class TeamQuotaAdmin(admin.ModelAdmin):
    list_display = ("team", "max_gpus", "gpu_hours_per_month", "when_budget_spent", "max_priority", "may_borrow", "share", "updated_at")
    list_filter = ("max_priority", "may_borrow")
    search_fields = ("team__slug",)

    def save_model(self, request, obj, form, change) -> None:
        before = quota_snapshot(TeamQuota.objects.get(pk=obj.pk)) if change else quota_snapshot(TeamQuota())
        super().save_model(request, obj, form, change)
        quota_audit_changes(quota=obj, before=before, actor=request.user, request=request)


@admin.register(UserQuota)
class UserQuotaAdmin(admin.ModelAdmin):
    list_display = ("team", "user", "max_gpus")
    list_filter = ("team",)
    autocomplete_fields = ["user", "team"]


def _decide(modeladmin, request, queryset, approve: bool) -> None:
    done = 0
    for quota_request in queryset:
        try:
            quota_request_decide(quota_request=quota_request, approve=approve, actor=request.user,
                                 note="decided in the admin", request=request)
            done += 1
        except QuotaRequestError as exc:
            modeladmin.message_user(request, str(exc), level=messages.WARNING)
    if done:
        modeladmin.message_user(request, f"{done} request(s) {'approved' if approve else 'rejected'}.")


@admin.action(description="Approve selected quota requests (applies the quota change)")
def approve_requests(modeladmin, request, queryset) -> None:
    _decide(modeladmin, request, queryset, approve=True)


@admin.action(description="Reject selected quota requests")
def reject_requests(modeladmin, request, queryset) -> None:
    _decide(modeladmin, request, queryset, approve=False)


@admin.register(QuotaRequest)
class QuotaRequestAdmin(admin.ModelAdmin):
    """Requests are decided through the actions only, so every decision goes through the audited service."""

    list_display = ("id", "team", "requested_by", "max_gpus", "gpu_hours_per_month", "state", "created_at",
                    "decided_by")
    list_filter = ("state",)
    search_fields = ("team__slug", "requested_by__username", "reason")
    actions = [approve_requests, reject_requests]
    readonly_fields = ("team", "requested_by", "max_gpus", "gpu_hours_per_month", "reason", "state", "created_at",
                       "decided_by", "decided_at", "decision_note")

    def has_add_permission(self, request) -> bool:
        return False
