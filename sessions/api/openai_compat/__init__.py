"""The OpenAI-compatible API at ``/api/openai/v1``: the tenant's agents as models.

An app written against the OpenAI SDK reaches an agent by its slug (``model``); every
request is an ordinary run of that agent in a chat of the token's user (the same runs,
approvals, budgets, throttles, usage and trace as a chat in the app). See docs/api.md,
"OpenAI-compatible API".

- :mod:`.errors`: OpenAI's error shape ``{"error": {message, type, code, param}}``.
- :mod:`.chat_request`: the ``POST /chat/completions`` body, validated (fields this API does
  not support are refused by name, never ignored).
- :mod:`.completion`: a run's events as chat-completion chunks, or as one completion.
- :mod:`.views`: the async views (authentication, the run's start, the stream).
"""
