from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy

from apps.dashboard import host_pages, job_metrics, jobs_table, secrets_pages, views

app_name = "dashboard"
urlpatterns = [
    path("", views.home, name="home"),
    path("jobs/", jobs_table.job_list, name="jobs"),
    path("jobs/pending/", jobs_table.job_pending, name="jobs-pending"),
    path("jobs/cancel/", jobs_table.job_bulk_cancel, name="jobs-cancel"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/compare/", job_metrics.job_compare, name="job-compare"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("services/", views.service_list, name="services"),
    path("services/<int:service_id>/", views.service_detail, name="service-detail"),
    path("services/<int:service_id>/scale/", views.service_scale, name="service-scale"),
    path("services/<int:service_id>/delete/", views.service_delete, name="service-delete"),
    path("teams/", views.team_list, name="teams"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    path("teams/<slug:slug>/members/", views.team_member_add, name="team-member-add"),
    path("teams/<slug:slug>/members/<str:username>/role/", views.team_member_role, name="team-member-role"),
    path("teams/<slug:slug>/members/<str:username>/remove/", views.team_member_remove, name="team-member-remove"),
    path("teams/<slug:slug>/quota-requests/", views.quota_request_new, name="quota-request-new"),
    path("teams/<slug:slug>/quota-requests/<int:request_id>/decision/", views.quota_request_decision,
         name="quota-request-decision"),
    # Issue 16: team secrets, and a host's runtime and cached images.
    path("teams/<slug:slug>/secrets/", secrets_pages.team_secrets_page, name="team-secrets"),
    path("teams/<slug:slug>/secrets/<str:name>/rotate/", secrets_pages.team_secret_rotate, name="team-secret-rotate"),
    path("teams/<slug:slug>/secrets/<str:name>/delete/", secrets_pages.team_secret_delete, name="team-secret-delete"),
    path("hosts/<str:name>/", host_pages.host_detail, name="host-detail"),
    path("hosts/<str:name>/gpus/<int:index>/", host_pages.gpu_detail, name="gpu-detail"),
    path("reports/usage/", views.usage_report, name="report-usage"),
    path("alerts/", views.alert_list, name="alerts"),
    path("alerts/<int:alert_id>/ack/", views.alert_ack, name="alert-ack"),
    path("accounts/tokens/", views.tokens, name="tokens"),
    path("accounts/tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
    path("accounts/password_change/", auth_views.PasswordChangeView.as_view(
        template_name="registration/password_change_form.html",
        success_url=reverse_lazy("dashboard:password-change-done")), name="password-change"),
    path("accounts/password_change/done/", auth_views.PasswordChangeDoneView.as_view(
        template_name="registration/password_change_done.html"), name="password-change-done"),
]
