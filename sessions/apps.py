from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    # The label "sessions" would clash with django.contrib.sessions.
    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Sessions and runs"
