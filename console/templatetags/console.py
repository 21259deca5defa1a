"""Template filters of the console: readable times, durations, money and JSON."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def when(value: Any) -> str:
    """An ISO 8601 string or a datetime → ``"26 Nov 2026, 06:44:14 UTC"`` (the server's time
    zone); "" for None."""
    if not value:
        return ""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    value = timezone.localtime(value) if timezone.is_aware(value) else value
    return value.strftime("%d %b %Y, %H:%M:%S ") + (value.tzname() or "")


@register.filter
def duration(ms: Any) -> str:
    """Milliseconds → ``"850 ms"``, ``"2.4 s"``, ``"3 min 5 s"``, ``"1 h 2 min"``; "" for None."""
    if ms is None or ms == "":
        return ""
    ms = float(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@register.filter
def pretty_json(value: Any) -> str:
    """A JSON value (or JSON text) indented for reading."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


@register.filter
def dollars(value: Any) -> str:
    """A decimal-dollar string or micro-USD int → ``"$0.0123"`` (4 significant decimals)."""
    if value is None or value == "":
        return "$0"
    amount = float(value) / 1_000_000 if isinstance(value, int) else float(value)
    if amount == 0:
        return "$0"
    return f"${amount:.4f}" if amount >= 0.0001 else f"${amount:.6f}"


@register.filter
def run_purpose(value: Any) -> str:
    """A ``Run.purpose`` value → its label ("chat" → "The chat app or the REST API"); an
    unknown value as it is."""
    from sessions.models import RunPurpose

    return RunPurpose(value).label if value in RunPurpose.values else str(value or "")
