from django.urls import include, path
from rest_framework.routers import SimpleRouter

from capabilities.api.commands import CommandViewSet
from capabilities.api.views import A2aAgentViewSet, McpServerViewSet, ProgramTemplateViewSet, SkillViewSet

router = SimpleRouter()
router.register("admin/mcp-servers", McpServerViewSet, basename="admin-mcp-server")
router.register("admin/a2a-agents", A2aAgentViewSet, basename="admin-a2a-agent")
router.register("admin/skills", SkillViewSet, basename="admin-skill")
router.register("admin/commands", CommandViewSet, basename="admin-command")
router.register("admin/program-templates", ProgramTemplateViewSet, basename="admin-program-template")
urlpatterns = [*router.urls, path("", include("capabilities.mcp_oauth.urls"))]
