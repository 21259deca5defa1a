from django.apps import AppConfig


class AgentSessionsConfig(AppConfig):
    # The label "sessions" would clash with django.contrib.sessions.
    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Sessions and runs"

    def ready(self) -> None:
        """Register the meter of model calls outside a run's turns (``llm.metering``): their
        LLMCall rows and the tenant's monthly budget (:mod:`sessions.llm_calls`)."""
        from llm.metering import meter_register
        from sessions.llm_calls import LLMCallMeter

        meter_register(LLMCallMeter())
        self._knowledge_status_events()

    def _knowledge_status_events(self) -> None:
        """Publish document status changes to the chat a document was added from
        (:func:`sessions.knowledge_uploads.document_status_publish`)."""
        from knowledge.document_status import document_status_listen
        from sessions.knowledge_uploads import document_status_publish

        document_status_listen(document_status_publish)
