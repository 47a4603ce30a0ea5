from django.contrib import admin

from apps.jobs.models import Job, JobAllocation, JobEvent, UsageSegment


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ("created_at", "from_state", "to_state", "reason", "actor", "data")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class JobAllocationInline(admin.TabularInline):
    model = JobAllocation
    extra = 0
    can_delete = False
    readonly_fields = ("gpu", "created_at", "released_at")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Jobs are changed through their services (API, console pages), never edited by hand here."""

    list_display = ("id", "name", "team", "user", "kind", "gpus", "priority", "state", "created_at")
    list_filter = ("state", "kind", "priority", "team")
    search_fields = ("name", "user__username", "team__slug")
    inlines = [JobAllocationInline, JobEventInline]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Job._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(UsageSegment)
class UsageSegmentAdmin(admin.ModelAdmin):
    list_display = ("job", "team", "user", "gpus", "started_at", "ended_at")
    list_filter = ("team",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in UsageSegment._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
