from rest_framework.routers import SimpleRouter

from capabilities.api.views import McpServerViewSet

router = SimpleRouter()
router.register("admin/mcp-servers", McpServerViewSet, basename="admin-mcp-server")
urlpatterns = router.urls
