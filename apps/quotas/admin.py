from django.contrib import admin

from apps.quotas.models import TeamQuota, UserQuota
from apps.quotas.services import quota_audit_changes, quota_snapshot


@admin.register(TeamQuota)
class TeamQuotaAdmin(admin.ModelAdmin):
    list_display = ("team", "max_gpus", "gpu_hours_per_month", "max_priority", "may_borrow", "share", "updated_at")
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
