from django.urls import path

from memory.api import views

urlpatterns = [
    path("memories/", views.MemoryListApi.as_view(), name="memory-list"),
    path("memories/extract/", views.MemoryExtractApi.as_view(), name="memory-extract"),
    path("memories/<int:memory_id>/", views.MemoryDetailApi.as_view(), name="memory-detail"),
]
