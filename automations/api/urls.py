from rest_framework.routers import SimpleRouter

from automations.api.views import ScheduleViewSet, WebhookTriggerViewSet

router = SimpleRouter()
router.register("schedules", ScheduleViewSet, basename="schedule")
router.register("webhook-triggers", WebhookTriggerViewSet, basename="webhook-trigger")
urlpatterns = router.urls
