"""CPU and wall time of a message POST's throttle check: DRF's loop (a cache ``get`` and a
``set`` per throttle) against :func:`tenants.throttling.throttles_check` (one ``get_many``, one
``set_many`` per window length), on the platform's Redis cache.

A message POST spends the ``messages`` and ``runs`` budgets per user and per tenant: four
throttles (:func:`tenants.throttling.throttles_for`). Each round checks them ``--checks`` times
for a user and tenant of its own, with rates high enough that nothing is refused (the
production defaults would refuse after 30), so every check reads and writes all four counters;
the variants alternate (ABAB…). Printed: µs per check, CPU (``time.process_time``: this
process; Redis's own time is not in it) and wall, median and range over the rounds.

Run: ``.venv/bin/python bench/throttle_check.py [--rounds 6] [--checks 500]``
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
from types import SimpleNamespace  # noqa: E402

import _harness  # noqa: E402,F401  (Django's settings)
from _stats import alternating_rounds, machine, print_cpu_and_wall  # noqa: E402

RATES = {"messages.user": "1000000/minute", "messages.tenant": "1000000/minute",
         "runs.user": "1000000/minute", "runs.tenant": "1000000/minute"}


def _drf_loop(throttles, request) -> bool:
    """DRF's ``APIView.check_throttles`` without the exception: each throttle on its own."""
    allowed = [throttle.allow_request(request, None) for throttle in throttles]  # every one asked, as DRF does
    return all(allowed)


def _batched(throttles, request) -> bool:
    from tenants.throttling import throttles_check

    return not throttles_check(throttles, request, None)


def _round(check, checks: int) -> tuple[float, float]:
    from django.core.cache import cache

    from tenants.throttling import throttles_for

    ident = uuid.uuid4().int % 10**9 + 10**9  # a user and a tenant no one else counts
    request = SimpleNamespace(user=SimpleNamespace(pk=ident, is_authenticated=True), tenant=SimpleNamespace(pk=ident))
    keys = [f"throttle_{scope}_{kind}_{ident}" for scope in ("messages", "runs") for kind in ("user", "tenant")]
    try:
        for _ in range(50):  # warm-up: connections, imports
            check(throttles_for(("messages", "runs")), request)
        cache.delete_many(keys)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(checks):
            assert check(throttles_for(("messages", "runs")), request)
        return ((time.process_time() - cpu) / checks * 1e6, (time.perf_counter() - wall) / checks * 1e6)
    finally:
        cache.delete_many(keys)


def main() -> None:
    from django.conf import settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--checks", type=int, default=500,
                        help="checks per round; each counter's history grows by one per check")
    args = parser.parse_args()
    settings.API_THROTTLE_RATES = {**settings.API_THROTTLE_RATES, **RATES}
    print(machine())
    variants = {"DRF's loop (get + set per throttle)": _drf_loop, "throttles_check (get_many + set_many)": _batched}
    figures = alternating_rounds({name: functools.partial(_round, check, args.checks) for name, check in variants.items()},
                                 args.rounds)
    print(f"4 throttles (messages and runs, per user and per tenant), {args.checks} checks a round, "
          f"{args.rounds} rounds each, alternating:")
    print_cpu_and_wall(figures, "check")


if __name__ == "__main__":
    main()
