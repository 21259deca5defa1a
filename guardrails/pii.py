"""Personal data in text: email addresses, phone numbers, IBANs and payment card numbers.

Candidates are found by regular expressions and kept only when they pass the number's own
check: an IBAN its ISO 13616 mod-97 checksum and its country's length, a card number the Luhn
checksum (both with ``python-stdnum``: :mod:`stdnum.iban`, :mod:`stdnum.luhn`). A phone number
is 8 to 15 digits (ITU-T E.164's maximum) written as one: starting with ``+``, ``00``, ``0`` or
``(``, or grouped by spaces, dashes, dots or parentheses; a bare run of digits is not one (an
order number). Overlaps go to the earlier type of :data:`PII_TYPES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from stdnum import iban, luhn

PII_TYPES = ("iban", "card", "email", "phone")
"""The types, in the order overlapping matches are decided."""

MASKS = {"email": "[EMAIL]", "phone": "[PHONE]", "iban": "[IBAN]", "card": "[CARD]"}
"""What a masked match is replaced by."""

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_PHONE = re.compile(r"(?<![\w@+])(?:\+|\()?\d[\d ().\-/]{6,20}\d(?![\w@])")


@dataclass(frozen=True, slots=True)
class Match:
    """One piece of personal data: ``text[start:end]`` is of ``type`` (a :data:`PII_TYPES` entry)."""

    type: str
    start: int
    end: int


def _digits(value: str) -> str:
    return "".join(ch for ch in value if ch.isdigit())


def _is_phone(value: str) -> bool:
    count = len(_digits(value))
    if not 8 <= count <= 15:
        return False
    return value[0] in "+(0" or any(sep in value for sep in " -./()")


def _candidates(kind: str, text: str) -> Iterable[Match]:
    if kind == "email":
        for m in _EMAIL.finditer(text):
            yield Match("email", m.start(), m.end())
    elif kind == "iban":
        for m in _IBAN.finditer(text):
            if iban.is_valid(m.group()):
                yield Match("iban", m.start(), m.end())
    elif kind == "card":
        for m in _CARD.finditer(text):
            digits = _digits(m.group())
            if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
                yield Match("card", m.start(), m.end())
    elif kind == "phone":
        for m in _PHONE.finditer(text):
            value = m.group().strip()
            if _is_phone(value):
                yield Match("phone", m.start(), m.start() + len(value))


def pii_find(text: str, types: Iterable[str] = PII_TYPES) -> list[Match]:
    """The personal data in ``text`` of ``types`` (any of :data:`PII_TYPES`), without overlaps,
    in text order."""
    wanted = set(types)
    taken: list[Match] = []
    for kind in PII_TYPES:
        if kind not in wanted:
            continue
        for match in _candidates(kind, text):
            if all(match.end <= t.start or match.start >= t.end for t in taken):
                taken.append(match)
    return sorted(taken, key=lambda m: m.start)


def pii_mask(text: str, matches: list[Match]) -> str:
    """``text`` with each of ``matches`` (:func:`pii_find`'s, in text order) replaced by its :data:`MASKS` entry."""
    out, last = [], 0
    for match in matches:
        out.append(text[last:match.start])
        out.append(MASKS[match.type])
        last = match.end
    out.append(text[last:])
    return "".join(out)
