from rest_framework.routers import SimpleRouter

from automations.api.views import (
    ScheduleViewSet,
    WebhookDeliveryViewSet,
    WebhookSubscriptionViewSet,
    WebhookTriggerViewSet,
)

router = SimpleRouter()
router.register("schedules", ScheduleViewSet, basename="schedule")
router.register("webhook-triggers", WebhookTriggerViewSet, basename="webhook-trigger")
router.register("admin/webhook-subscriptions", WebhookSubscriptionViewSet, basename="admin-webhook-subscription")
router.register("admin/webhook-deliveries", WebhookDeliveryViewSet, basename="admin-webhook-delivery")
urlpatterns = router.urls
