from django.contrib import admin

from apps.accounts.models import ApiToken, Membership, Team, TeamSecret


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]  # apps.quotas.admin adds the team's quotas


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("team", "user", "role", "created_at")
    list_filter = ("role", "team")
    search_fields = ("user__username", "team__slug")
    autocomplete_fields = ["user", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = ("user", "name", "prefix", "digest", "created_at", "last_used_at")
    exclude = ()

    def has_add_permission(self, request) -> bool:
        return False  # tokens are created by their owner, who is the only one to see the secret


@admin.register(TeamSecret)
class TeamSecretAdmin(admin.ModelAdmin):
    """Names and versions only: values are set through the API or the team's page (audited, shown once)."""

    list_display = ("team", "name", "version", "created_by", "created_at", "rotated_at")
    list_filter = ("team",)
    search_fields = ("name", "team__slug")
    fields = ("team", "name", "version", "created_by", "created_at", "rotated_at")
    readonly_fields = fields

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:  # the page and the API audit a deletion
        return False
