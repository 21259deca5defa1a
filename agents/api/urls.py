from django.urls import path
from rest_framework.routers import SimpleRouter

from agents.api.commands import AgentCommandCompleteApi, AgentCommandListApi, AgentCommandRenderApi
from agents.api.views import AgentListApi, AgentViewSet, BindingViewSet

router = SimpleRouter()
router.register("admin/agents", AgentViewSet, basename="admin-agent")
router.register("admin/bindings", BindingViewSet, basename="admin-binding")
urlpatterns = [
    path("agents/", AgentListApi.as_view(), name="agent-list"),
    path("agents/<int:agent_id>/commands/", AgentCommandListApi.as_view(), name="agent-commands"),
    path("agents/<int:agent_id>/commands/<path:name>/render/", AgentCommandRenderApi.as_view(),
         name="agent-command-render"),
    path("agents/<int:agent_id>/commands/<path:name>/complete/", AgentCommandCompleteApi.as_view(),
         name="agent-command-complete"),
    *router.urls,
]
