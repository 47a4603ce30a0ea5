from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from apps.accounts import api as accounts_api
from apps.accounts import audit_api
from apps.accounts import secrets_api as accounts_secrets_api
from apps.cluster import agent_api as cluster_agent_api
from apps.cluster import api as cluster_api
from apps.cluster import volumes_api as cluster_volumes_api
from apps.core import runtime_package
from apps.jobs import agent_api as jobs_agent_api
from apps.jobs import api as jobs_api
from apps.jobs import code_snapshot_api, usage_api
from apps.jobs import job_api as jobs_job_api
from apps.operations import agent_api as operations_agent_api
from apps.quotas import api as quotas_api
from apps.serving import api as serving_api
from apps.serving import gateway as serving_gateway
from apps.telemetry import api as telemetry_api
from apps.telemetry import history_api
from apps.telemetry import metrics as telemetry_metrics

router = DefaultRouter()
router.register("users", accounts_api.UserViewSet, basename="user")
router.register("teams", accounts_api.TeamViewSet, basename="team")
router.register("tokens", accounts_api.TokenViewSet, basename="token")
router.register("hosts", cluster_api.HostViewSet, basename="host")
router.register("jobs", jobs_api.JobViewSet, basename="job")
router.register("audit", audit_api.AuditEventViewSet, basename="audit")
router.register("alerts", telemetry_api.AlertViewSet, basename="alert")
router.register("alert-rules", telemetry_api.AlertRuleViewSet, basename="alert-rule")
router.register("services", serving_api.ServiceViewSet, basename="service")
# Issue 16: volumes admins define, which jobs mount by name.
router.register("volumes", cluster_volumes_api.VolumeViewSet, basename="volume")

api_v1 = [
    path("auth/token/", accounts_api.ObtainTokenView.as_view(), name="auth-token"),
    path("teams/<slug:slug>/members/", accounts_api.TeamMembersView.as_view(), name="team-members"),
    path("teams/<slug:slug>/members/<str:username>/", accounts_api.TeamMemberView.as_view(), name="team-member"),
    path("teams/<slug:slug>/quota/", quotas_api.TeamQuotaView.as_view(), name="team-quota"),
    path("teams/<slug:slug>/usage/", usage_api.TeamUsageView.as_view(), name="team-usage"),
    # Issue 16: team secrets (names for members; managers create, rotate and delete).
    path("teams/<slug:slug>/secrets/", accounts_secrets_api.TeamSecretsView.as_view(), name="team-secrets"),
    path("teams/<slug:slug>/secrets/<str:name>/", accounts_secrets_api.TeamSecretView.as_view(),
         name="team-secret"),
    # Issue 18: history (apps/telemetry/series.py).
    path("metrics/cluster/", history_api.ClusterMetricsView.as_view(), name="metrics-cluster"),
    path("hosts/<str:name>/metrics/", history_api.HostMetricsView.as_view(), name="host-metrics"),
    path("gpus/<str:uuid>/metrics/", history_api.GpuMetricsView.as_view(), name="gpu-metrics"),
    path("teams/<slug:slug>/allocation/", history_api.TeamAllocationView.as_view(), name="team-allocation"),
    path("presets/", jobs_api.PresetsView.as_view(), name="presets"),
    path("workloads/", jobs_api.WorkloadsView.as_view(), name="workloads"),
    path("agent/register/", cluster_agent_api.RegisterView.as_view(), name="agent-register"),
    path("agent/heartbeat/", operations_agent_api.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("agent/telemetry/", telemetry_api.TelemetryIngestView.as_view(), name="agent-telemetry"),
    path("ws-ticket/", telemetry_api.WsTicketView.as_view(), name="ws-ticket"),
    path("jobs/<int:pk>/gpu-summary/", telemetry_api.JobGpuSummaryView.as_view(), name="job-gpu-summary"),
    path("agent/jobs/<int:job_id>/status/", jobs_agent_api.JobStatusView.as_view(), name="agent-job-status"),
    path("agent/jobs/<int:job_id>/logs/", jobs_agent_api.JobLogView.as_view(), name="agent-job-logs"),
    path("agent/jobs/<int:job_id>/progress/", jobs_agent_api.JobProgressView.as_view(), name="agent-job-progress"),
    path("agent/jobs/<int:job_id>/secrets/", jobs_job_api.JobSecretsView.as_view(), name="agent-job-secrets"),
    # An artifact's path may end in a file name (the router would want a trailing slash after it).
    path("jobs/<int:pk>/artifacts/<path:path>", jobs_api.JobViewSet.as_view({"get": "artifact"}),
         name="job-artifact-file"),
    path("job/", jobs_job_api.JobSelfView.as_view(), name="job-self"),
    path("job/progress/", jobs_job_api.JobSelfProgressView.as_view(), name="job-self-progress"),
    path("job/artifacts/", jobs_job_api.JobSelfArtifactsView.as_view(), name="job-self-artifacts"),
    path("job/artifacts/<path:path>", jobs_job_api.JobSelfArtifactView.as_view(), name="job-self-artifact"),
    # The job runtime as a wheel for users' images (no login): a stable URL redirecting to the versioned file.
    path("runtime/wheel/", runtime_package.wheel_latest, name="runtime-wheel"),
    re_path(r"^runtime/(?P<filename>[A-Za-z0-9_.+-]+\.whl)$", runtime_package.wheel_file, name="runtime-wheel-file"),
    # Code snapshots (issue 16): a team's uploaded code, and the job API's copy for the job's agent.
    path("code-snapshots/", code_snapshot_api.CodeSnapshotsView.as_view(), name="code-snapshots"),
    path("code-snapshots/<uuid:snapshot_id>/", code_snapshot_api.CodeSnapshotView.as_view(), name="code-snapshot"),
    path("code-snapshots/<uuid:snapshot_id>/download/", code_snapshot_api.CodeSnapshotDownloadView.as_view(),
         name="code-snapshot-download"),
    path("job/code/", jobs_job_api.JobSelfCodeView.as_view(), name="job-self-code"),
    path("", include(router.urls)),
]

if settings.BENCHMARK_ENDPOINTS:
    from apps.jobs.bench import BareInsertView

    api_v1.insert(0, path("bench/bare-insert/", BareInsertView.as_view(), name="bench-bare-insert"))

handler404 = "apps.core.views.not_found"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", telemetry_metrics.metrics_view, name="metrics"),
    path("serve/<slug:team>/<slug:service>/predict", serving_gateway.predict, name="serve-predict"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("", include("apps.dashboard.urls")),
]
