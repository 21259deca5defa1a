"""``/api/openai/v1/``: the OpenAI-compatible API (:mod:`sessions.api.openai_compat`)."""

from django.urls import path, re_path

from sessions.api.openai_compat import views

urlpatterns = [
    path("models", views.models_list, name="openai-models"),
    path("models/<str:model_id>", views.model_get, name="openai-model"),
    path("chat/completions", views.chat_completions, name="openai-chat-completions"),
    path("responses", views.responses_create, name="openai-responses"),
    path("responses/<str:response_id_>", views.response_detail, name="openai-response"),
    path("responses/<str:response_id_>/cancel", views.response_cancel, name="openai-response-cancel"),
    re_path(r"^(?P<rest>.*)$", views.unknown_path, name="openai-unknown"),  # a 404 in OpenAI's shape
]
