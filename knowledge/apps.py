from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    """Knowledge bases: documents, ingestion (parse → chunk → embed), hybrid retrieval."""

    name = "knowledge"
    verbose_name = "Knowledge"

    def ready(self) -> None:
        import knowledge.kind  # noqa: F401 - registers the ``knowledge`` capability kind
