from rest_framework.routers import SimpleRouter

from llm.api.views import ProviderViewSet, RouteViewSet

router = SimpleRouter()
router.register("admin/providers", ProviderViewSet, basename="admin-provider")
router.register("admin/routes", RouteViewSet, basename="admin-route")
urlpatterns = router.urls
