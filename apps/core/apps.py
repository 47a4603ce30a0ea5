from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """django.contrib.admin with the console's site, which audits every change (apps/core/admin_audit.py)."""

    default = False  # (named in INSTALLED_APPS; CoreConfig stays this module's default)
    default_site = "apps.core.admin_audit.AuditedAdminSite"
