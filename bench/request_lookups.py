"""CPU of the lookups every message POST and every stream's opening makes: each as the ORM's
queryset against the hand-written statement the platform runs (``agent_platform.model_rows``).

- **token**: the API token by its hash, with its membership, user and tenant
  (:func:`tenants.selectors.api_token_authenticate`; every request with a token, every
  stream's opening);
- **chat**: the caller's chat by its id, with its agent
  (:func:`sessions.selectors.chat_session_get_for_user`; every message POST);
- **visible**: whether the caller may follow that chat
  (:func:`sessions.selectors.chat_session_visible_to_user`; every stream's opening).

Each round makes one lookup ``--lookups`` times on a throwaway tenant (its token's
``last_used_at`` recent, so no update is made); the two forms of a lookup alternate (ABAB…).
Printed: µs of CPU per lookup (``time.process_time``: this process; PostgreSQL's own time is not
in it) and wall, median and range over the rounds.

Run: ``.venv/bin/python bench/request_lookups.py [--rounds 6] [--lookups 2000]``
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from datetime import timedelta  # noqa: E402

import _harness  # noqa: E402,F401  (Django's settings, the system scope)
from _stats import alternating_rounds, machine, print_cpu_and_wall  # noqa: E402


def _round(lookup: Callable[[], object], lookups: int) -> tuple[float, float]:
    for _ in range(50):  # warm-up: the connection, imports, the statement's cache
        assert lookup()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(lookups):
        lookup()
    return (time.process_time() - cpu) / lookups * 1e6, (time.perf_counter() - wall) / lookups * 1e6


def _lookups(raw: str, session_id: int, user_id: int) -> dict[str, dict[str, Callable[[], object]]]:
    """Each lookup's two forms: the queryset the platform used before (as of 7d1adab) and what it runs now."""
    from sessions.models import ChatSession
    from sessions.selectors import chat_session_get_for_user, chat_session_visible_to_user
    from tenants.models import ApiToken
    from tenants.selectors import api_token_authenticate
    from tenants.services import token_hash

    def token_orm():
        return ApiToken.all_tenants.select_related("membership__user", "membership__tenant").get(
            token_hash=token_hash(raw), revoked_at__isnull=True)

    def chat_orm():
        return ChatSession.objects.select_related("agent").get(pk=session_id, user_id=user_id, deleted_at__isnull=True)

    def visible_orm():
        return ChatSession.objects.filter(pk=session_id, user_id=user_id, deleted_at__isnull=True).exists()

    return {
        "token with its membership, user and tenant": {
            "ORM queryset (select_related, get)": token_orm,
            "hand-written statement": functools.partial(api_token_authenticate, raw=raw)},
        "chat with its agent": {
            "ORM queryset (select_related, get)": chat_orm,
            "hand-written statement": functools.partial(chat_session_get_for_user, session_id=session_id,
                                                        user_id=user_id)},
        "may the caller follow the chat": {
            "ORM queryset (exists)": visible_orm,
            "hand-written SELECT 1": functools.partial(chat_session_visible_to_user, session_id=session_id,
                                                       user_id=user_id)},
    }


def main() -> None:
    from django.utils import timezone

    from tenants.models import ApiToken
    from tenants.scoping import tenant_scope
    from tenants.services import api_token_create, membership_create

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--lookups", type=int, default=2000)
    args = parser.parse_args()
    print(machine())
    with _harness.BenchTenant("http://127.0.0.1:9/v1") as bench:  # (the agent's model is never called)
        issued = api_token_create(membership=membership_create(tenant=bench.tenant, user=bench.user))
        ApiToken.all_tenants.filter(pk=issued.token.pk).update(last_used_at=timezone.now() + timedelta(days=1))
        with tenant_scope(bench.tenant.pk):
            from sessions.services import chat_session_create

            session = chat_session_create(user=bench.user, agent=bench.agent)
            for lookup, forms in _lookups(issued.raw, session.pk, bench.user.pk).items():
                figures = alternating_rounds({name: functools.partial(_round, form, args.lookups)
                                              for name, form in forms.items()}, args.rounds)
                print(f"{lookup}: {args.lookups} lookups a round, {args.rounds} rounds each, alternating:")
                print_cpu_and_wall(figures, "lookup")


if __name__ == "__main__":
    main()
