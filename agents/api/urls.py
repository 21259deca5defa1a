from django.urls import path
from rest_framework.routers import SimpleRouter

from agents.api.views import AgentListApi, AgentViewSet, BindingViewSet

router = SimpleRouter()
router.register("admin/agents", AgentViewSet, basename="admin-agent")
router.register("admin/bindings", BindingViewSet, basename="admin-binding")
urlpatterns = [path("agents/", AgentListApi.as_view(), name="agent-list"), *router.urls]
