from django.contrib import admin

from apps.serving.models import InferenceService, ServiceEvent


class ServiceEventInline(admin.TabularInline):
    model = ServiceEvent
    extra = 0
    can_delete = False
    readonly_fields = ("created_at", "kind", "reason", "data")


@admin.register(InferenceService)
class InferenceServiceAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "workload", "preset", "desired_replicas", "min_replicas", "max_replicas", "state")
    list_filter = ("state", "team")
    inlines = [ServiceEventInline]
