from django.urls import path

from sessions.api import chats, knowledge_uploads, pinned_resources, resources, views
from sessions.sse import session_events_sse

urlpatterns = [
    path("sessions/", chats.ChatListCreateApi.as_view(), name="session-list"),
    path("sessions/<int:session_id>/", chats.ChatDetailApi.as_view(), name="session-detail"),
    path("sessions/<int:session_id>/restore/", chats.ChatRestoreApi.as_view(), name="session-restore"),
    path("sessions/<int:session_id>/regenerate/", chats.SessionRegenerateApi.as_view(), name="session-regenerate"),
    path("sessions/<int:session_id>/continue/", chats.SessionContinueApi.as_view(), name="session-continue"),
    path("sessions/<int:session_id>/attachments/", chats.AttachmentUploadApi.as_view(), name="session-attachments"),
    path("runs/<int:run_id>/edit/", chats.RunEditApi.as_view(), name="run-edit"),
    path("runs/<int:run_id>/retry/", chats.RunRetryApi.as_view(), name="run-retry"),
    path("usage/me/", chats.UsageMeApi.as_view(), name="usage-me"),
    path("sessions/<int:session_id>/messages/", views.MessagePostApi.as_view(), name="session-messages"),
    path("sessions/<int:session_id>/events", session_events_sse, name="session-events"),
    path("runs/<int:run_id>/", views.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<int:run_id>/cancel/", views.RunCancelApi.as_view(), name="run-cancel"),
    path("admin/usage/", views.UsageApi.as_view(), name="admin-usage"),
    path("sessions/<int:session_id>/artifacts/", views.SessionArtifactListApi.as_view(), name="session-artifacts"),
    path("sessions/<int:session_id>/artifacts/<int:artifact_id>/add-to-knowledge/",
         knowledge_uploads.ArtifactAddToKnowledgeApi.as_view(), name="session-artifact-add-to-knowledge"),
    path("sessions/<int:session_id>/knowledge-uploads/", knowledge_uploads.ChatKnowledgeUploadsApi.as_view(),
         name="session-knowledge-uploads"),
    path("artifacts/<int:artifact_id>/", views.ArtifactDetailApi.as_view(), name="artifact-detail"),
    path("artifacts/<int:artifact_id>/content", views.ArtifactContentApi.as_view(), name="artifact-content"),
    path("approvals/", views.ApprovalListApi.as_view(), name="approval-list"),
    path("approvals/<int:approval_id>/", views.ApprovalDecideApi.as_view(), name="approval-decide"),
    path("runs/<int:run_id>/activities/", views.RunActivitiesApi.as_view(), name="run-activities"),
    path("agents/<int:agent_id>/resources/", resources.AgentResourceListApi.as_view(), name="agent-resources"),
    path("sessions/<int:session_id>/pinned-resources/", pinned_resources.PinnedResourceListCreateApi.as_view(),
         name="session-pinned-resources"),
    path("sessions/<int:session_id>/pinned-resources/<int:pin_id>/", pinned_resources.PinnedResourceDeleteApi.as_view(),
         name="session-pinned-resource"),
]
