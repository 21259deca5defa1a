from django.urls import path

from sessions.consumers import SessionEventsConsumer

websocket_urlpatterns = [
    path("ws/sessions/<int:session_id>/", SessionEventsConsumer.as_asgi()),
]
