from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "apps.accounts"
    label = "accounts"

    def ready(self) -> None:
        # Login/logout auditing hooks onto Django's own auth signals: the only place these events are raised.
        from apps.accounts import auth_audit  # noqa: F401
