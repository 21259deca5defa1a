"""A2A push notifications: a task's (a run's) push-notification configs, kept in
:class:`sessions.models.TaskPushConfig`, and the notification each state change sends.

- The configs are set, read, listed and deleted through A2A (``CreateTaskPushNotificationConfig``,
  ``GetTaskPushNotificationConfig``, ``ListTaskPushNotificationConfigs``,
  ``DeleteTaskPushNotificationConfig``, and ``SendMessage``'s
  ``configuration.taskPushNotificationConfig``), always within the caller's own tasks
  (:func:`.tasks.caller_runs`): another tenant's, user's or agent's task is "not found".
  :class:`RunPushConfigStore` is the a2a-sdk's ``PushNotificationConfigStore`` over those rows.
- A config's ``url`` is checked by the outbound address rules when it is set
  (:func:`llm.netrules.check_outbound_url`: http(s), no loopback, private, link-local or
  metadata address unless an operator allowed it; ``InvalidParamsError`` names the reason) and
  again at every connect of every delivery. ``token`` and ``authentication.credentials`` are
  stored encrypted with the tenant's data key.
- A run's end (completed, failed, cancelled) and its pause for a person's decision
  (input-required) are each one notification per config: automations' run-event observer
  (``automations.outbound.task_push_emit``) writes a delivery with :func:`push_payload` and
  sends it with the outbound webhooks' retries and backoff. The body is the A2A
  ``StreamResponse`` holding the task as it stood (``{"task": {...}}``, as the a2a-sdk's own
  sender posts it); the request carries ``X-A2A-Notification-Token: <token>`` (and
  ``A2A-Notification-Token``, the a2a-go spelling), ``Authorization: <scheme> <credentials>``
  when the config has both, and ``webhook-id`` (the same on every retry of one notification).
  Each attempt is signed: a JWT over the body in ``X-A2A-Notification-Signature`` (also
  ``Authorization: Bearer`` when the config sets none), checkable with the JWKS at
  ``/.well-known/jwks.json`` (:mod:`.signing`).
"""

from __future__ import annotations

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.tasks import PushNotificationConfigStore
from a2a.types.a2a_pb2 import AuthenticationInfo, TaskPushNotificationConfig
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from a2a.utils.proto_utils import to_stream_response
from channels.db import database_sync_to_async
from django.db import transaction
from google.protobuf.json_format import MessageToDict

from llm.netrules import FetchError, check_outbound_url
from sessions.api.a2a.tasks import A2ACaller, caller_of, caller_runs, run_id_of, task_of_run
from sessions.models import Run, TaskPushConfig
from tenants.crypto import secret_decrypt, secret_encrypt
from tenants.models import Tenant
from tenants.scoping import tenant_scope

MAX_CONFIGS_PER_TASK = 10
"""Most push-notification configs one task may have."""
MAX_ID_CHARS = 200
MAX_URL_CHARS = 2000
MAX_TOKEN_CHARS = 1000
MAX_SCHEME_CHARS = 64
MAX_CREDENTIALS_CHARS = 4000


def push_config_check(config: TaskPushNotificationConfig) -> None:
    """Check a push-notification config before it is stored: a URL the outbound rules accept,
    fields within their lengths. Blocking (the URL's host is resolved).

    Raises:
        InvalidParamsError: what is wrong, naming the field.
    """
    limits = (("id", config.id, MAX_ID_CHARS), ("url", config.url, MAX_URL_CHARS),
              ("token", config.token, MAX_TOKEN_CHARS),
              ("authentication.scheme", config.authentication.scheme, MAX_SCHEME_CHARS),
              ("authentication.credentials", config.authentication.credentials, MAX_CREDENTIALS_CHARS))
    for name, value, limit in limits:
        if len(value) > limit:
            raise InvalidParamsError(message=f"{name}: at most {limit} characters.")
    if not config.url:
        raise InvalidParamsError(message="url: the push-notification receiver's URL is required.")
    try:
        check_outbound_url(config.url)
    except FetchError as exc:
        raise InvalidParamsError(message=f"url: {exc.message}") from exc
    if config.authentication.credentials and not config.authentication.scheme:
        raise InvalidParamsError(message="authentication.scheme: required with credentials (e.g. Bearer).")


def _message(row: TaskPushConfig, tenant: Tenant) -> TaskPushNotificationConfig:
    config = TaskPushNotificationConfig(id=row.config_id, task_id=str(row.run_id), url=row.url)
    if row.token_encrypted:
        config.token = secret_decrypt(tenant=tenant, ciphertext=row.token_encrypted)
    if row.auth_scheme:
        config.authentication.CopyFrom(AuthenticationInfo(
            scheme=row.auth_scheme,
            credentials=(secret_decrypt(tenant=tenant, ciphertext=row.auth_credentials_encrypted)
                         if row.auth_credentials_encrypted else "")))
    return config


def push_config_save(*, run: Run, config: TaskPushNotificationConfig, base_url: str) -> TaskPushNotificationConfig:
    """Store ``config`` for ``run`` (checked with :func:`push_config_check` first; the same id
    replaces the earlier config of that id; no id: the task's id). Requires the run's tenant
    scope.

    Raises:
        InvalidParamsError: a bad config, or the task has :data:`MAX_CONFIGS_PER_TASK` already.
    """
    push_config_check(config)
    config_id = config.id or str(run.pk)
    tenant = Tenant.objects.get(pk=run.tenant_id)
    fields = {
        "url": config.url,
        "token_encrypted": secret_encrypt(tenant=tenant, plaintext=config.token) if config.token else "",
        "auth_scheme": config.authentication.scheme,
        "auth_credentials_encrypted": (secret_encrypt(tenant=tenant, plaintext=config.authentication.credentials)
                                       if config.authentication.credentials else ""),
        "base_url": base_url[:300],
    }
    with transaction.atomic():
        Run.objects.select_for_update(no_key=True).filter(pk=run.pk).first()  # one writer per task at a time
        existing = TaskPushConfig.objects.filter(run=run, config_id=config_id).first()
        if existing is None:
            if TaskPushConfig.objects.filter(run=run).count() >= MAX_CONFIGS_PER_TASK:
                raise InvalidParamsError(
                    message=f"Task {run.pk} has {MAX_CONFIGS_PER_TASK} push-notification configs already; "
                            "delete one first.")
            existing = TaskPushConfig(tenant_id=run.tenant_id, run=run, config_id=config_id)
        for name, value in fields.items():
            setattr(existing, name, value)
        existing.save()
    return _message(existing, tenant)


def _caller_run(caller: A2ACaller, task_id: str) -> Run:
    run_id = run_id_of(task_id)
    run = None if run_id is None else caller_runs(caller).filter(pk=run_id).first()
    if run is None:
        raise TaskNotFoundError(message=f"Task {task_id} not found.")
    return run


def push_config_set_sync(caller: A2ACaller, task_id: str,
                         config: TaskPushNotificationConfig) -> TaskPushNotificationConfig:
    """Store ``config`` for the caller's task ``task_id`` (:func:`push_config_save`).

    Raises:
        TaskNotFoundError: not the caller's task.
        InvalidParamsError: as :func:`push_config_save`.
    """
    with tenant_scope(caller.tenant_id):
        return push_config_save(run=_caller_run(caller, task_id), config=config, base_url=caller.base_url)


def push_configs_sync(caller: A2ACaller, task_id: str) -> list[TaskPushNotificationConfig]:
    """The push-notification configs of the caller's task ``task_id``, oldest first.

    Raises:
        TaskNotFoundError: not the caller's task.
    """
    with tenant_scope(caller.tenant_id):
        run = _caller_run(caller, task_id)
        tenant = Tenant.objects.get(pk=caller.tenant_id)
        return [_message(row, tenant) for row in TaskPushConfig.objects.filter(run=run).order_by("id")]


def push_config_delete_sync(caller: A2ACaller, task_id: str, config_id: str | None) -> int:
    """Delete config ``config_id`` of the caller's task (every config with None); how many went.

    Raises:
        TaskNotFoundError: not the caller's task.
    """
    with tenant_scope(caller.tenant_id):
        rows = TaskPushConfig.objects.filter(run=_caller_run(caller, task_id))
        if config_id is not None:
            rows = rows.filter(config_id=config_id)
        deleted, _ = rows.delete()
        return deleted


class RunPushConfigStore(PushNotificationConfigStore):
    """The a2a-sdk's ``PushNotificationConfigStore`` over :class:`sessions.models.TaskPushConfig`,
    within the caller of the call context (:func:`.tasks.caller_of`). Delivery does not go
    through the SDK's sender (best effort, in the web process): see the module docstring."""

    async def set_info(self, task_id: str, notification_config: TaskPushNotificationConfig,
                       context: ServerCallContext) -> TaskPushNotificationConfig:  # noqa: D102
        return await database_sync_to_async(push_config_set_sync)(caller_of(context), task_id, notification_config)

    async def get_info(self, task_id: str, context: ServerCallContext) -> list[TaskPushNotificationConfig]:  # noqa: D102
        return await database_sync_to_async(push_configs_sync)(caller_of(context), task_id)

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        """Not used: notifications are sent by automations' deliveries (module docstring)."""
        return []

    async def delete_info(self, task_id: str, context: ServerCallContext,
                          config_id: str | None = None) -> None:  # noqa: D102
        await database_sync_to_async(push_config_delete_sync)(caller_of(context), task_id, config_id)


def push_payload(run: Run, base_url: str) -> dict[str, Any]:
    """The notification body for ``run`` as it stands: the A2A ``StreamResponse`` holding its
    task (``{"task": {...}}``, the proto's JSON form). Requires the run's tenant scope."""
    caller = A2ACaller(tenant_id=run.tenant_id, user_id=0, membership_id=0, token_id=0, agent_id=0, agent_slug="",
                       base_url=base_url)
    return MessageToDict(to_stream_response(task_of_run(run, caller)))


def push_targets(run_id: int) -> list[tuple[TaskPushConfig, dict[str, Any]]]:
    """The push-notification configs of run ``run_id``, each with the body to send it now
    (:func:`push_payload`; one body per distinct ``base_url``). [] without configs (one query).
    Requires the run's tenant scope."""
    rows = list(TaskPushConfig.objects.filter(run_id=run_id).order_by("id"))
    if not rows:
        return []
    run = Run.objects.get(pk=run_id)
    bodies: dict[str, dict[str, Any]] = {}
    targets = []
    for row in rows:
        if row.base_url not in bodies:
            bodies[row.base_url] = push_payload(run, row.base_url)
        targets.append((row, bodies[row.base_url]))
    return targets
