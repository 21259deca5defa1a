"""CPU of the API token's lookup: the ORM's ``select_related`` queryset against the hand-written
statement :func:`tenants.selectors.api_token_authenticate` runs (``agent_platform.model_rows``).

Every API request with a token and every stream's opening looks its token up: the token by its
hash, with its membership, user and tenant. Each round looks up one throwaway token
``--lookups`` times (``last_used_at`` recent, so no update is made); the variants alternate
(ABAB…). Printed: µs of CPU per lookup (``time.process_time``: this process; PostgreSQL's own
time is not in it) and wall, median and range over the rounds.

Run: ``.venv/bin/python bench/token_lookup.py [--rounds 6] [--lookups 2000]``
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from datetime import timedelta  # noqa: E402

import _harness  # noqa: E402,F401  (Django's settings, the system scope)
from _stats import alternating_rounds, machine, print_cpu_and_wall  # noqa: E402


def _orm(raw: str):
    """The queryset the lookup used before (as of 7d1adab): ``get()`` with ``select_related``."""
    from tenants.models import ApiToken
    from tenants.services import token_hash

    return ApiToken.all_tenants.select_related("membership__user", "membership__tenant").get(
        token_hash=token_hash(raw), revoked_at__isnull=True)


def _hand_written(raw: str):
    from tenants.selectors import api_token_authenticate

    return api_token_authenticate(raw=raw)


def _round(lookup, raw: str, lookups: int) -> tuple[float, float]:
    for _ in range(50):  # warm-up: the connection, imports, the statement's cache
        lookup(raw)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(lookups):
        assert lookup(raw).membership.tenant is not None
    return (time.process_time() - cpu) / lookups * 1e6, (time.perf_counter() - wall) / lookups * 1e6


def main() -> None:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from tenants.models import ApiToken, Tenant
    from tenants.services import api_token_create, membership_create, tenant_create

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--lookups", type=int, default=2000)
    args = parser.parse_args()
    print(machine())
    slug = f"bench-{uuid.uuid4().hex[:8]}"
    tenant = tenant_create(name=slug, slug=slug)
    user = get_user_model().objects.create_user(username=slug)
    try:
        issued = api_token_create(membership=membership_create(tenant=tenant, user=user))
        ApiToken.all_tenants.filter(pk=issued.token.pk).update(last_used_at=timezone.now() + timedelta(days=1))
        variants = {"ORM queryset (select_related, get)": _orm, "hand-written statement (model_rows)": _hand_written}
        figures = alternating_rounds(
            {name: functools.partial(_round, lookup, issued.raw, args.lookups) for name, lookup in variants.items()},
            args.rounds)
    finally:
        user.delete()
        Tenant.objects.filter(pk=tenant.pk).delete()
    print(f"the token with its membership, user and tenant, {args.lookups} lookups a round, {args.rounds} rounds each, "
          "alternating:")
    print_cpu_and_wall(figures, "lookup")


if __name__ == "__main__":
    main()
