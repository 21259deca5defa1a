from django.urls import path

from console.api import RunTraceApi

urlpatterns = [
    path("runs/<int:run_id>/trace/", RunTraceApi.as_view(), name="run-trace"),
]
