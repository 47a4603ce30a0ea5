from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """Where two apps must meet (jobs and telemetry, cluster and jobs, serving and telemetry): the top layer."""

    name = "apps.operations"
    label = "operations"
