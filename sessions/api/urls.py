from django.urls import path

from sessions.api import views
from sessions.sse import session_events_sse

urlpatterns = [
    path("sessions/", views.SessionListCreateApi.as_view(), name="session-list"),
    path("sessions/<int:session_id>/", views.SessionDetailApi.as_view(), name="session-detail"),
    path("sessions/<int:session_id>/messages/", views.MessagePostApi.as_view(), name="session-messages"),
    path("sessions/<int:session_id>/events", session_events_sse, name="session-events"),
    path("runs/<int:run_id>/", views.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<int:run_id>/cancel/", views.RunCancelApi.as_view(), name="run-cancel"),
    path("admin/usage/", views.UsageApi.as_view(), name="admin-usage"),
    path("sessions/<int:session_id>/artifacts/", views.SessionArtifactListApi.as_view(), name="session-artifacts"),
    path("artifacts/<int:artifact_id>/", views.ArtifactDetailApi.as_view(), name="artifact-detail"),
    path("artifacts/<int:artifact_id>/content", views.ArtifactContentApi.as_view(), name="artifact-content"),
    path("approvals/", views.ApprovalListApi.as_view(), name="approval-list"),
    path("approvals/<int:approval_id>/", views.ApprovalDecideApi.as_view(), name="approval-decide"),
    path("runs/<int:run_id>/activities/", views.RunActivitiesApi.as_view(), name="run-activities"),
]
