from django.urls import include, path

urlpatterns = [
    path("", include("tenants.api.urls")),
    path("", include("agents.api.urls")),
    path("", include("llm.api.urls")),
    path("", include("capabilities.api.urls")),
    path("", include("sessions.api.urls")),
    path("", include("documents.api.urls")),
    path("", include("browser.api.urls")),
    path("", include("memory.api.urls")),
    path("", include("knowledge.api.urls")),
    path("", include("evaluation.api.urls")),  # admin: datasets, experiments
    path("", include("automations.api.urls")),  # schedules, webhook triggers
    path("", include("guardrails.api.urls")),  # admin: agents' guardrails
    path("", include("console.api_urls")),  # the run trace for the run's user
    path("", include("oauth_server.api_urls")),  # the user's OAuth grants (Settings)
]
