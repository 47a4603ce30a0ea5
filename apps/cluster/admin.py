from typing import Any

from django import forms
from django.contrib import admin

from apps.cluster.models import GPU, Host, HostCredential, Volume
from apps.cluster.volumes import (
    audit_volume_change,
    default_target,
    host_path_problem,
    target_problem,
    volume_delete,
    volume_summary,
)


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ("index", "gpu_type", "model_name", "uuid", "memory_mb", "health", "health_reason")


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "runtime", "simulated", "last_heartbeat", "agent_version", "driver_version")
    list_filter = ("state", "simulated")
    search_fields = ("name",)
    inlines = [GPUInline]
    actions = ["start_draining", "stop_draining"]

    @admin.action(description="Drain: no new jobs (kept across restarts)")
    def start_draining(self, request, queryset) -> None:
        from apps.cluster.services import host_set_draining

        for host in queryset:
            host_set_draining(host, True, actor=request.user, request=request)

    @admin.action(description="End draining")
    def stop_draining(self, request, queryset) -> None:
        from apps.cluster.services import host_set_draining

        for host in queryset:
            host_set_draining(host, False, actor=request.user, request=request)

    def save_model(self, request, obj, form, change) -> None:
        from apps.cluster.services import host_set_draining

        drain = obj.state == Host.State.DRAINING or (obj.drain and obj.state == Host.State.DOWN)
        super().save_model(request, obj, form, change)
        host_set_draining(obj, drain, actor=request.user, request=request)  # (audited when it changes)
        obj.drain = drain


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


class VolumeForm(forms.ModelForm):
    """The same path rules as the API (apps/cluster/volumes.py); a blank target is /mnt/<name>."""

    class Meta:
        model = Volume
        fields = ["name", "host_path", "target", "read_only", "teams", "all_teams", "description"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["target"].required = False

    def clean_host_path(self) -> str:
        if problem := host_path_problem(self.cleaned_data["host_path"]):
            raise forms.ValidationError(problem)
        return self.cleaned_data["host_path"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("name") and not data.get("target"):
            data["target"] = default_target(data["name"])
        if data.get("target") and (problem := target_problem(data["target"])):
            self.add_error("target", problem)
        return data


@admin.register(Volume)
class VolumeAdmin(admin.ModelAdmin):
    form = VolumeForm
    list_display = ("name", "host_path", "target", "read_only", "all_teams")
    list_filter = ("read_only", "all_teams", "teams")
    search_fields = ("name", "host_path")
    filter_horizontal = ("teams",)

    def save_related(self, request, form, formsets, change) -> None:
        super().save_related(request, form, formsets, change)  # the teams are set here, after save_model
        volume = form.instance
        what: dict[str, Any] = {"changed": sorted(form.changed_data)} if change else {"created": True}
        audit_volume_change(request.user, volume, request, **what, **volume_summary(volume))

    def delete_model(self, request, obj: Volume) -> None:
        volume_delete(volume=obj, actor=request.user, request=request)

    def delete_queryset(self, request, queryset) -> None:
        for volume in queryset:
            volume_delete(volume=volume, actor=request.user, request=request)
