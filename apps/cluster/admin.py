from django.contrib import admin

from apps.cluster.models import GPU, Host, HostCredential


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ("index", "gpu_type", "model_name", "uuid", "memory_mb", "health", "health_reason")


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "simulated", "last_heartbeat", "agent_version", "driver_version")
    list_filter = ("state", "simulated")
    search_fields = ("name",)
    inlines = [GPUInline]
    actions = ["start_draining", "stop_draining"]

    @admin.action(description="Drain: no new jobs (kept across restarts)")
    def start_draining(self, request, queryset) -> None:
        from apps.cluster.services import host_set_draining

        for host in queryset:
            host_set_draining(host, True)

    @admin.action(description="End draining")
    def stop_draining(self, request, queryset) -> None:
        from apps.cluster.services import host_set_draining

        for host in queryset:
            host_set_draining(host, False)

    def save_model(self, request, obj, form, change) -> None:
        obj.drain = obj.state == Host.State.DRAINING or (obj.drain and obj.state == Host.State.DOWN)
        super().save_model(request, obj, form, change)


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ("__str__", "gpu_type", "memory_mb", "health", "uuid")
    list_filter = ("gpu_type", "health", "host")
    search_fields = ("uuid", "host__name")


@admin.register(HostCredential)
class HostCredentialAdmin(admin.ModelAdmin):
    list_display = ("host", "prefix", "created_at")
    readonly_fields = ("host", "prefix", "digest", "created_at")

    def has_add_permission(self, request) -> bool:
        return False
