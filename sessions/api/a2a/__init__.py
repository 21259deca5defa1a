"""A2A 1.0 at ``/a2a/<slug>/``: every agent of a tenant an A2A server, built on the official
``a2a-sdk`` (its JSON-RPC and HTTP+JSON Starlette routes, its types, errors and version checks).

A task is a run (task id = run id), its ``contextId`` the run's chat session; the reply is the
``reply`` artifact; a run waiting for a person's approval is ``TASK_STATE_INPUT_REQUIRED`` (a
message to the task answers it); cancelling a task cancels the run; ``/a2a/<slug>@<n>/`` runs the
agent's version ``n``. The same runs, approvals,
budgets, throttles, usage and trace as a chat in the app. See docs/api.md, "A2A".

- :mod:`.app`: the ASGI app (authentication, the agent of the URL, the SDK's routes).
- :mod:`.cards`: the agent card.
- :mod:`.handler`: the SDK ``RequestHandler``: every operation over runs.
- :mod:`.tasks`: runs as A2A tasks; the SDK ``TaskStore`` over runs.
- :mod:`.push`: push-notification configs per task (the SDK ``PushNotificationConfigStore``) and
  the notification each state change sends (delivered by ``automations.outbound``).
- :mod:`.signing`: the notifications' signature (a JWT, ES256) and the JWKS at
  ``/.well-known/jwks.json``.
"""
