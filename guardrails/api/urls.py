from rest_framework.routers import SimpleRouter

from guardrails.api.views import GuardrailViewSet

router = SimpleRouter()
router.register("admin/guardrails", GuardrailViewSet, basename="admin-guardrail")
urlpatterns = router.urls
