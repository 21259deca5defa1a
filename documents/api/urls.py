from django.urls import path

from documents.api import views

urlpatterns = [
    path("documents/", views.DocumentListApi.as_view(), name="document-list"),
    path("documents/<int:document_id>/", views.DocumentDetailApi.as_view(), name="document-detail"),
]
