from django.urls import path

from sessions.api import views

urlpatterns = [
    path("sessions/", views.SessionListCreateApi.as_view(), name="session-list"),
    path("sessions/<int:session_id>/", views.SessionDetailApi.as_view(), name="session-detail"),
    path("sessions/<int:session_id>/messages/", views.MessagePostApi.as_view(), name="session-messages"),
    path("runs/<int:run_id>/", views.RunDetailApi.as_view(), name="run-detail"),
    path("admin/usage/", views.UsageApi.as_view(), name="admin-usage"),
    path("runs/<int:run_id>/activities/", views.RunActivitiesApi.as_view(), name="run-activities"),
]
