from django.urls import path
from rest_framework.routers import SimpleRouter

from evaluation.api.views import (
    DatasetItemDetailApi,
    DatasetItemFromRunApi,
    DatasetItemListApi,
    DatasetViewSet,
    ExperimentViewSet,
)

router = SimpleRouter()
router.register("admin/datasets", DatasetViewSet, basename="admin-dataset")
router.register("admin/experiments", ExperimentViewSet, basename="admin-experiment")
urlpatterns = [
    path("admin/datasets/<int:dataset_id>/items/", DatasetItemListApi.as_view(), name="admin-dataset-items"),
    path(
        "admin/datasets/<int:dataset_id>/items/from-run/",
        DatasetItemFromRunApi.as_view(),
        name="admin-dataset-item-from-run",
    ),
    path(
        "admin/datasets/<int:dataset_id>/items/<int:item_id>/",
        DatasetItemDetailApi.as_view(),
        name="admin-dataset-item",
    ),
    *router.urls,
]
