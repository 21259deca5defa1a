"""``POST /hooks/<trigger id>/``: an inbound webhook, verified per Standard Webhooks
(https://www.standardwebhooks.com/: ``webhook-id``, ``webhook-timestamp`` at most 5 minutes
off, ``webhook-signature`` ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` with the
trigger's secret; checked by the ``standardwebhooks`` package), starts a run of the trigger's
agent with the message its template makes from the JSON payload.

Answers (``{message, extra}`` on errors, as the API's):
202 ``{run_id, chat_id}``; 200 the same for a replayed ``webhook-id`` (no second run: the id is
the idempotency key); 401 a missing, bad or expired signature; 400 a body that is not JSON or
lacks a field the template uses; 404 no such active trigger; 409 the run cannot start (inactive
agent or owner); 413 a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``; 429 the owner's or tenant's
``messages``/``runs`` throttle.
"""

from __future__ import annotations

import json
import logging
import uuid

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from standardwebhooks.webhooks import Webhook

from agent_platform.api_errors import ApplicationError
from automations.models import WebhookTrigger
from automations.services import PayloadInvalid, inbound_webhook_accept
from tenants.crypto import secret_decrypt
from tenants.scoping import system_scope, tenant_scope
from tenants.throttling import throttle_wait

logger = logging.getLogger(__name__)

THROTTLE_SCOPES = ("messages", "runs")
MAX_WEBHOOK_ID_CHARS = 255
"""The longest ``webhook-id`` kept (the idempotency row's column)."""


def _error(status: int, message: str, **extra: object) -> JsonResponse:
    return JsonResponse({"message": message, "extra": extra}, status=status)


def _trigger_get(trigger_id: str) -> WebhookTrigger | None:
    try:
        key = uuid.UUID(trigger_id)
    except ValueError:
        return None
    with system_scope():  # the trigger decides the tenant: looked up across tenants by its id
        return (
            WebhookTrigger.objects.unscoped()  # tenant-bypass: the unguessable id names the tenant
            .select_related("tenant", "owner")
            .filter(pk=key, is_active=True)
            .first()
        )


def _verify(trigger: WebhookTrigger, body: bytes, request: HttpRequest) -> str | None:
    """The reason the signature is refused, or None when it holds."""
    headers = {name: request.headers.get(name, "") for name in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    try:
        secret = secret_decrypt(tenant=trigger.tenant, ciphertext=trigger.secret_encrypted)
        Webhook(secret).verify(body.decode("utf-8"), headers, json_parse=False)
    except Exception as exc:  # the package raises ValueError, binascii.Error, … for malformed headers
        return str(exc) or type(exc).__name__
    return None


@csrf_exempt
@require_POST
def inbound_webhook(request: HttpRequest, trigger_id: str) -> JsonResponse:
    """Accept one signed request for trigger ``trigger_id`` (see the module's docstring)."""
    trigger = _trigger_get(trigger_id)
    if trigger is None:
        return _error(404, "No such webhook trigger.")
    try:
        body = request.body
    except RequestDataTooBig:
        return _error(413, "The request body is too large.")
    with tenant_scope(trigger.tenant_id):
        refused = _verify(trigger, body, request)
        if refused is not None:
            return _error(401, f"Webhook signature refused: {refused}.")
        try:
            payload = json.loads(body)
        except ValueError:
            return _error(400, "The body is not JSON.")
        if len(request.headers["webhook-id"]) > MAX_WEBHOOK_ID_CHARS:
            return _error(400, f"The webhook-id is longer than {MAX_WEBHOOK_ID_CHARS} characters.")
        wait = throttle_wait(scopes=THROTTLE_SCOPES, user_id=trigger.owner_id, tenant_id=trigger.tenant_id)
        if wait is not None:
            response = _error(429, "Too many requests; try again later.")
            response["Retry-After"] = str(max(1, int(wait + 0.999)))
            return response
        try:
            row, created = inbound_webhook_accept(
                trigger=trigger, webhook_id=request.headers["webhook-id"], payload=payload
            )
        except PayloadInvalid as exc:
            return _error(400, str(exc))
        except ApplicationError as exc:
            return _error(409, exc.message)
    answer = {"run_id": row.run_id, "chat_id": row.chat_id}
    if not created:
        return JsonResponse({**answer, "replayed": True}, status=200)
    return JsonResponse(answer, status=202)
