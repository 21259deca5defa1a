from django.urls import path

from knowledge.api import views

urlpatterns = [
    path("knowledge-bases/", views.KnowledgeBaseListApi.as_view(), name="knowledge-base-list"),
    path("knowledge-bases/<int:knowledge_base_id>/", views.KnowledgeBaseDetailApi.as_view(),
         name="knowledge-base-detail"),
    path("knowledge-bases/<int:knowledge_base_id>/reembed/", views.KnowledgeBaseReembedApi.as_view(),
         name="knowledge-base-reembed"),
    path("knowledge-bases/<int:knowledge_base_id>/search/", views.KnowledgeBaseSearchApi.as_view(),
         name="knowledge-base-search"),
    path("knowledge-bases/<int:knowledge_base_id>/documents/", views.DocumentListApi.as_view(),
         name="knowledge-document-list"),
    path("knowledge-bases/<int:knowledge_base_id>/documents/<int:document_id>/", views.DocumentDetailApi.as_view(),
         name="knowledge-document-detail"),
    path("knowledge-bases/<int:knowledge_base_id>/documents/<int:document_id>/reingest/",
         views.DocumentReingestApi.as_view(), name="knowledge-document-reingest"),
    path("knowledge/chunks/<int:chunk_id>/", views.ChunkDetailApi.as_view(), name="knowledge-chunk-detail"),
]
