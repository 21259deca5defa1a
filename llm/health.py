"""Per-entry health shared by every worker: cooldowns and a circuit breaker per route entry.

The router asks :meth:`EntryHealth.available` before trying an entry and reports every
attempt's outcome (:meth:`~EntryHealth.record_success` / :meth:`~EntryHealth.record_failure`).
:class:`RedisEntryHealth` keeps the state in Redis so all Celery workers and web processes
see the same cooldowns; :class:`MemoryEntryHealth` has the same semantics in one process
(tests, scripts).

Rules (one breaker per entry key, e.g. ``"entry:42"``):

* **Closed** (normal): every call goes through. Calls and failures are counted over a
  sliding window of :data:`WINDOW_SECONDS` (60 s).
* **Opened** for the failing class's cooldown (:data:`DEFAULT_COOLDOWN_SECONDS`) when

  - more than half of the calls in the window failed, with at least :data:`MIN_CALLS` (4)
    calls in it (``failures * 2 > calls``);
  - at once on a non-retryable status (:data:`OPEN_AT_ONCE_CLASSES`: ``quota_exhausted``,
    ``auth``, ``not_found``), for ``max(class cooldown, Retry-After)``;
  - when the router gave up on the entry after a failure carrying ``Retry-After``
    (``retries_exhausted=True``): for that long; a ``rate_limit`` without one opens for the
    class default (30 s). This is how "Retry-After longer than 30 s: cooldown for that
    long" and "rate_limit opens the entry when retries are exhausted" are implemented.

  Every cooldown is capped at :data:`MAX_COOLDOWN_SECONDS` (1 h).
* **Open**: :meth:`~EntryHealth.available` answers False until ``cooldown_until``.
* **Half-open**: the first ``available()`` after the cooldown takes the single probe slot
  (True); everyone else gets False while the probe is out (the slot is a lease of
  :data:`PROBE_LEASE_SECONDS`, so a worker that dies mid-probe does not wedge the entry).
  The probe's success closes the breaker and clears the window; its failure reopens it with
  the previous cooldown doubled (at least the failing class's own opening time, capped at
  1 h).

Classes whose cooldown is 0 (``content_policy``, ``bad_request``, ``context_window``) are
about the request, not the entry: they count as calls, never as failures, and never change
the breaker's state. The router reports ``bad_request`` and ``context_window`` answers as
successes (the entry answered).

Time comes from an injectable :class:`~llm.clock.Clock` (``time()``: epoch seconds, shared
by all processes, so workers' clocks are assumed NTP-synchronised).
"""

from __future__ import annotations

import itertools
import math
import os
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

from llm.clock import Clock, SystemClock
from llm.errors import LLMError

if TYPE_CHECKING:
    import redis.asyncio

BreakerState = Literal["closed", "open", "half_open"]

DEFAULT_COOLDOWN_SECONDS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "rate_limit": 30.0,
        "overloaded": 30.0,
        "server": 30.0,
        "timeout": 30.0,
        "network": 30.0,
        "other": 30.0,
        "quota_exhausted": 3600.0,
        "auth": 600.0,
        "not_found": 600.0,
        "content_policy": 0.0,
        "context_window": 0.0,
        "bad_request": 0.0,
    }
)
"""Cooldown per error class, seconds, when the breaker opens for that class.

======================================  ========  ==============================================
class                                   cooldown  why
======================================  ========  ==============================================
rate_limit                              30 s      a provider's per-minute window; Retry-After,
                                                  when sent, replaces it
overloaded / server / timeout / network 30 s      transient; long enough for a deploy or a
/ other                                           load spike to pass, short enough not to lose
                                                  a healthy entry for long
quota_exhausted                         1 h       needs a human to top up; probing more often
                                                  only burns requests
auth / not_found                        10 min    needs a configuration fix (key, model name)
content_policy / context_window /       0         about the request, not the entry: no breaker
bad_request
======================================  ========  ==============================================

These are this project's defaults (no provider documents a breaker); unknown classes use
30 s.
"""

OPEN_AT_ONCE_CLASSES: Final[frozenset[str]] = frozenset({"quota_exhausted", "auth", "not_found"})
"""Non-retryable statuses that open the breaker on the first failure."""

WINDOW_SECONDS: Final[float] = 60.0
"""Sliding window over which calls and failures are counted, seconds."""

MIN_CALLS: Final[int] = 4
"""Fewest calls in the window before the failure ratio can open the breaker."""

MAX_COOLDOWN_SECONDS: Final[float] = 3600.0
"""Cap on any cooldown (doubling, Retry-After), seconds."""

PROBE_LEASE_SECONDS: Final[float] = 120.0
"""How long a half-open probe slot stays taken without an outcome, seconds."""

STATE_IDLE_TTL_SECONDS: Final[int] = 3600
"""Redis: an entry's state key expires this long after its last write (or after the end of
its cooldown, whichever is later); window keys expire after ``2 × WINDOW_SECONDS``."""


@dataclass(frozen=True, slots=True)
class EntryHealthSnapshot:
    """The health of one entry at one moment (for admin pages, logs and tests)."""

    state: BreakerState
    """``open`` while cooling down; ``half_open`` once the cooldown has passed (a probe may
    go, or is out); ``closed`` otherwise."""
    cooldown_until: float | None
    """End of the current/last cooldown, Unix epoch seconds; None when closed."""
    calls_last_minute: int
    """Attempts recorded in the last :data:`WINDOW_SECONDS`."""
    failures_last_minute: int
    """Of which failures (classes with a non-zero cooldown)."""
    last_error_class: str | None
    """Class of the last recorded failure, or None."""


class HealthStateUnavailable(LLMError):
    """The shared health store could not be reached (e.g. Redis down).

    The router treats it as "no information": the entry is tried and the outcome is not
    recorded. Model calls never fail because of health bookkeeping.
    """


@runtime_checkable
class EntryHealth(Protocol):
    """Shared cooldown / circuit-breaker state per route entry (see the module docstring).

    Keys are :attr:`llm.config.RouteEntryConfig.health_key` values. Every method may raise
    :class:`HealthStateUnavailable`.
    """

    async def available(self, key: str) -> bool:
        """True when the entry may be tried now.

        Side effect: when the cooldown has passed, takes the single half-open probe slot for
        the caller (only one caller gets True until the probe's outcome is recorded or its
        lease expires).
        """
        ...

    async def record_success(self, key: str) -> None:
        """Count a successful attempt; closes a half-open (or expired-open) breaker."""
        ...

    async def record_failure(
        self,
        key: str,
        error_class: str,
        *,
        retry_after_seconds: float | None = None,
        retries_exhausted: bool = True,
    ) -> None:
        """Count a failed attempt and open/reopen the breaker per the rules.

        Args:
            key: The entry's health key.
            error_class: A :data:`llm.errors.ERROR_CLASSES` value.
            retry_after_seconds: The provider's Retry-After, seconds, if it sent one.
            retries_exhausted: False while the router will retry this entry within the
                current call (the failure only counts); True when it gives up on the entry.
        """
        ...

    async def snapshot(self, key: str) -> EntryHealthSnapshot:
        """The entry's current state; no side effects."""
        ...


def cooldown_for(error_class: str) -> float:
    """The default cooldown of ``error_class``, seconds (30 s for unknown classes)."""
    return DEFAULT_COOLDOWN_SECONDS.get(error_class, 30.0)


@dataclass(frozen=True, slots=True)
class _FailurePlan:
    counts_as_failure: bool
    class_cooldown: float
    open_now_seconds: float
    """> 0: open (at least) this long right away, regardless of the ratio."""


def _failure_plan(error_class: str, retry_after_seconds: float | None, retries_exhausted: bool) -> _FailurePlan:
    cooldown = cooldown_for(error_class)
    if cooldown <= 0:
        return _FailurePlan(False, 0.0, 0.0)
    retry_after = retry_after_seconds if retry_after_seconds is not None and retry_after_seconds > 0 else None
    open_now = 0.0
    if error_class in OPEN_AT_ONCE_CLASSES:
        open_now = max(cooldown, retry_after or 0.0)
    elif retries_exhausted and retry_after is not None:
        open_now = retry_after
    elif retries_exhausted and error_class == "rate_limit":
        open_now = cooldown
    return _FailurePlan(True, cooldown, min(open_now, MAX_COOLDOWN_SECONDS))


# --- in-process ----------------------------------------------------------------------------


@dataclass(slots=True)
class _MemoryState:
    state: BreakerState = "closed"
    cooldown_until: float = 0.0
    cooldown_seconds: float = 0.0
    probe_until: float = 0.0
    last_error_class: str | None = None
    calls: deque[float] = field(default_factory=deque)
    failures: deque[float] = field(default_factory=deque)


class MemoryEntryHealth:
    """:class:`EntryHealth` in this process's memory (same rules as :class:`RedisEntryHealth`).

    Args:
        clock: Time source (default :class:`~llm.clock.SystemClock`).

    Not shared between processes; every method completes without awaiting anything else, so
    it is atomic within one event loop.
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._states: dict[str, _MemoryState] = {}

    def _state(self, key: str) -> _MemoryState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _MemoryState()
        return state

    @staticmethod
    def _trim(state: _MemoryState, now: float) -> None:
        for times in (state.calls, state.failures):
            while times and times[0] < now - WINDOW_SECONDS:
                times.popleft()

    @staticmethod
    def _close(state: _MemoryState) -> None:
        state.state = "closed"
        state.cooldown_until = state.cooldown_seconds = state.probe_until = 0.0
        state.calls.clear()
        state.failures.clear()

    async def available(self, key: str) -> bool:
        now = self._clock.time()
        state = self._state(key)
        if state.state == "closed":
            return True
        if state.state == "open":
            if now < state.cooldown_until:
                return False
            state.state = "half_open"
            state.probe_until = now + PROBE_LEASE_SECONDS
            return True
        if now >= state.probe_until:
            state.probe_until = now + PROBE_LEASE_SECONDS
            return True
        return False

    async def record_success(self, key: str) -> None:
        now = self._clock.time()
        state = self._state(key)
        self._trim(state, now)
        if state.state == "half_open" or (state.state == "open" and now >= state.cooldown_until):
            self._close(state)
        state.calls.append(now)

    async def record_failure(
        self,
        key: str,
        error_class: str,
        *,
        retry_after_seconds: float | None = None,
        retries_exhausted: bool = True,
    ) -> None:
        now = self._clock.time()
        plan = _failure_plan(error_class, retry_after_seconds, retries_exhausted)
        state = self._state(key)
        self._trim(state, now)
        state.calls.append(now)
        state.last_error_class = error_class
        if not plan.counts_as_failure:
            return
        state.failures.append(now)
        calls, failures = len(state.calls), len(state.failures)
        cooldown = 0.0
        if state.state == "half_open":
            cooldown = max(state.cooldown_seconds * 2, plan.open_now_seconds, plan.class_cooldown)
        elif plan.open_now_seconds > 0:
            cooldown = plan.open_now_seconds
        elif calls >= MIN_CALLS and failures * 2 > calls:
            cooldown = plan.class_cooldown
        if cooldown <= 0:
            return
        cooldown = min(cooldown, MAX_COOLDOWN_SECONDS)
        until = now + cooldown
        if state.state == "open" and state.cooldown_until > until:
            until = state.cooldown_until
            cooldown = max(state.cooldown_seconds, cooldown)
        state.state = "open"
        state.cooldown_until = until
        state.cooldown_seconds = cooldown
        state.probe_until = 0.0

    async def snapshot(self, key: str) -> EntryHealthSnapshot:
        now = self._clock.time()
        state = self._states.get(key) or _MemoryState()
        since = now - WINDOW_SECONDS
        effective: BreakerState = state.state
        if effective == "open" and now >= state.cooldown_until:
            effective = "half_open"
        return EntryHealthSnapshot(
            state=effective,
            cooldown_until=None if effective == "closed" else state.cooldown_until,
            calls_last_minute=sum(1 for t in state.calls if t >= since),
            failures_last_minute=sum(1 for t in state.failures if t >= since),
            last_error_class=state.last_error_class,
        )


# --- Redis ---------------------------------------------------------------------------------

# One script, dispatched on ARGV[1], so every operation is a single atomic round trip.
# KEYS: state hash, calls zset, failures zset. Numbers go to Redis as "%.6f" strings (Lua
# would otherwise format them with 14 significant digits) and come back as strings (Redis
# truncates Lua numbers returned to the client to integers).
_LUA: Final[str] = r"""
local s, c, f = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]
local now = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local min_calls = tonumber(ARGV[4])
local max_cd = tonumber(ARGV[5])
local lease = tonumber(ARGV[6])
local idle_ttl = tonumber(ARGV[7])
local member = ARGV[8]

local function num(x) return string.format('%.6f', x) end

local function get_state()
  local v = redis.call('HMGET', s, 'state', 'cooldown_until', 'cooldown_seconds', 'last_error_class', 'probe_until')
  return v[1] or 'closed', tonumber(v[2]) or 0, tonumber(v[3]) or 0, v[4], tonumber(v[5]) or 0
end

local function expire_state(until_)
  if redis.call('EXISTS', s) == 1 then
    redis.call('EXPIRE', s, math.ceil(math.max(until_ - now, 0) + idle_ttl))
  end
end

local function trim()
  local cutoff = '(' .. num(now - window)
  redis.call('ZREMRANGEBYSCORE', c, '-inf', cutoff)
  redis.call('ZREMRANGEBYSCORE', f, '-inf', cutoff)
end

local function add(key)
  redis.call('ZADD', key, num(now), member)
  redis.call('PEXPIRE', key, math.floor(window * 2000))
end

local function close()
  redis.call('HSET', s, 'state', 'closed', 'cooldown_until', '0', 'cooldown_seconds', '0', 'probe_until', '0')
  redis.call('DEL', c, f)
end

if op == 'available' then
  local st, cu, cs, lec, pu = get_state()
  if st == 'closed' then return 1 end
  if st == 'open' then
    if now < cu then return 0 end
    redis.call('HSET', s, 'state', 'half_open', 'probe_until', num(now + lease))
    expire_state(now + lease)
    return 1
  end
  if now >= pu then
    redis.call('HSET', s, 'probe_until', num(now + lease))
    expire_state(now + lease)
    return 1
  end
  return 0
end

if op == 'success' then
  trim()
  local st, cu = get_state()
  if st == 'half_open' or (st == 'open' and now >= cu) then
    close()
    st = 'closed'
  end
  add(c)
  if st == 'open' then expire_state(cu) else expire_state(now) end
  return 1
end

if op == 'failure' then
  local cls = ARGV[9]
  local counts = tonumber(ARGV[10])
  local class_cd = tonumber(ARGV[11])
  local open_now = tonumber(ARGV[12])
  trim()
  local st, cu, cs = get_state()
  add(c)
  redis.call('HSET', s, 'last_error_class', cls)
  if counts == 0 then
    if st == 'open' then expire_state(cu) else expire_state(now) end
    return 1
  end
  add(f)
  local calls = redis.call('ZCARD', c)
  local fails = redis.call('ZCARD', f)
  local cd = 0
  if st == 'half_open' then
    cd = math.max(cs * 2, open_now, class_cd)
  elseif open_now > 0 then
    cd = open_now
  elseif calls >= min_calls and fails * 2 > calls then
    cd = class_cd
  end
  if cd > 0 then
    cd = math.min(cd, max_cd)
    local until_ = now + cd
    if st == 'open' and cu > until_ then
      until_ = cu
      cd = math.max(cs, cd)
    end
    redis.call('HSET', s, 'state', 'open', 'cooldown_until', num(until_),
               'cooldown_seconds', num(cd), 'probe_until', '0')
    expire_state(until_)
  elseif st == 'open' then
    expire_state(cu)
  else
    expire_state(now)
  end
  return 1
end

if op == 'snapshot' then
  local st, cu, cs, lec = get_state()
  if st == 'open' and now >= cu then st = 'half_open' end
  local since = num(now - window)
  local calls = redis.call('ZCOUNT', c, since, '+inf')
  local fails = redis.call('ZCOUNT', f, since, '+inf')
  return {st, num(cu), tostring(calls), tostring(fails), lec or ''}
end

return redis.error_reply('unknown op ' .. tostring(op))
"""


class RedisEntryHealth:
    """:class:`EntryHealth` in Redis, shared by every process using the same ``prefix``.

    Args:
        client: An asyncio Redis client (``redis.asyncio.Redis``; ``decode_responses`` either
            way). Its socket timeouts bound every call.
        prefix: Key namespace, e.g. ``"agent_platform:llm:health"``; keys are
            ``{prefix}:{entry key}:s`` (state hash), ``…:c`` (calls) and ``…:f`` (failures),
            sorted sets scored by epoch seconds.
        clock: Time source (default :class:`~llm.clock.SystemClock`); its ``time()`` is what
            the script compares cooldowns with.

    Each operation is one ``EVALSHA`` of a Lua script, so it is atomic across processes.
    Every key expires (see :data:`STATE_IDLE_TTL_SECONDS`).

    ``execute``, if given, sends the operations instead of ``client``: a function that takes
    one command's arguments (``"EVAL", script, numkeys, *keys, *args``) and returns an
    awaitable of its raw reply. The runner passes ``sessions.events.pipelined_command``, which
    pipelines them with the event loop's other Redis traffic on one connection.

    Raises:
        HealthStateUnavailable: from every method, when Redis fails (connection, timeout,
            script error).
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str,
        clock: Clock | None = None,
        execute: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        if not prefix:
            raise ValueError("prefix must be a non-empty key namespace")
        self._client = client
        self._execute = execute
        self._prefix = prefix
        self._clock = clock or SystemClock()
        self._script = client.register_script(_LUA)
        self._ids = itertools.count()
        self._process_tag = f"{os.getpid()}-{id(self):x}"

    @property
    def prefix(self) -> str:
        return self._prefix

    def keys_for(self, key: str) -> list[str]:
        """The Redis keys holding ``key``'s state: ``[state hash, calls zset, failures zset]``."""
        base = f"{self._prefix}:{key}"
        return [f"{base}:s", f"{base}:c", f"{base}:f"]

    async def _run(self, op: str, key: str, *extra: str) -> object:
        import redis.exceptions  # noqa: PLC0415 - keeps the module importable without redis

        now = self._clock.time()
        member = f"{now:.6f}:{self._process_tag}:{next(self._ids)}"
        args = [
            op,
            f"{now:.6f}",
            f"{WINDOW_SECONDS:g}",
            str(MIN_CALLS),
            f"{MAX_COOLDOWN_SECONDS:g}",
            f"{PROBE_LEASE_SECONDS:g}",
            str(STATE_IDLE_TTL_SECONDS),
            member,
            *extra,
        ]
        try:
            if self._execute is not None:
                return await self._execute("EVAL", _LUA, 3, *self.keys_for(key), *args)
            return await self._script(keys=self.keys_for(key), args=args)
        except (redis.exceptions.RedisError, OSError, TimeoutError) as exc:
            raise HealthStateUnavailable(f"entry health store unavailable: {type(exc).__name__}: {exc}") from exc

    async def available(self, key: str) -> bool:
        return int(await self._run("available", key)) == 1  # type: ignore[call-overload]

    async def record_success(self, key: str) -> None:
        await self._run("success", key)

    async def record_failure(
        self,
        key: str,
        error_class: str,
        *,
        retry_after_seconds: float | None = None,
        retries_exhausted: bool = True,
    ) -> None:
        plan = _failure_plan(error_class, retry_after_seconds, retries_exhausted)
        await self._run(
            "failure",
            key,
            error_class,
            "1" if plan.counts_as_failure else "0",
            f"{plan.class_cooldown:.6f}",
            f"{plan.open_now_seconds:.6f}",
        )

    async def snapshot(self, key: str) -> EntryHealthSnapshot:
        raw = await self._run("snapshot", key)
        state, cooldown_until, calls, failures, last = (_text(v) for v in raw)  # type: ignore[union-attr]
        until = float(cooldown_until)
        return EntryHealthSnapshot(
            state=state,  # type: ignore[arg-type]
            cooldown_until=None if state == "closed" or not math.isfinite(until) else until,
            calls_last_minute=int(calls),
            failures_last_minute=int(failures),
            last_error_class=last or None,
        )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = [
    "DEFAULT_COOLDOWN_SECONDS",
    "MAX_COOLDOWN_SECONDS",
    "MIN_CALLS",
    "OPEN_AT_ONCE_CLASSES",
    "PROBE_LEASE_SECONDS",
    "WINDOW_SECONDS",
    "BreakerState",
    "EntryHealth",
    "EntryHealthSnapshot",
    "HealthStateUnavailable",
    "MemoryEntryHealth",
    "RedisEntryHealth",
    "cooldown_for",
]
