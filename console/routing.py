"""Websocket routes."""

from __future__ import annotations

from django.urls import path

from apps.telemetry.consumers import ClusterConsumer, JobConsumer

websocket_urlpatterns = [
    path("ws/cluster/", ClusterConsumer.as_asgi()),
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
]
