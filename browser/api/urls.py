from django.urls import path

from browser.api import views

urlpatterns = [
    path("browser/pairings/", views.BrowserPairingCreateApi.as_view(), name="browser-pairing-create"),
    path("browser/pairings/approve/", views.BrowserPairingApproveApi.as_view(), name="browser-pairing-approve"),
    path("browser/pairings/<int:pairing_id>/token/", views.BrowserPairingTokenApi.as_view(), name="browser-pairing-token"),
    path("browser/devices/", views.BrowserDeviceListApi.as_view(), name="browser-device-list"),
    path("browser/devices/<int:device_id>/", views.BrowserDeviceDetailApi.as_view(), name="browser-device-detail"),
]
