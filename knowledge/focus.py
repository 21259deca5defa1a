"""Passage focus: a retrieved passage cut to the lines that share words with the question.

A knowledge binding's ``"focus": true`` (:mod:`knowledge.kind`) sends the model, for each
passage retrieved before the first turn, only its lines (a table row, a list item, a sentence of
a paragraph) that share the most words with the user's message, instead of the whole chunk
(~500 characters). Meant for small CPU models: a CPU model reads its prompt at ~20–60 tokens a
second, and whole chunks are most of its prompt; and a small model takes a neighbouring value
(the next row of a settings table) more often when there are neighbours to take.

Measured (docs/model-accuracy.md, issue 38): of the 42 Docs QA questions, the 35 whose first 4
passages hold every expected fact still hold them focused, with 31 % fewer passage characters;
but on 14 of them the embedded 0.5B model, given focused passages and a one-sentence answer
prompt, answered 5 and 6 right (whole passages and the demo's prompt: 8), and with the demo's
prompt 7 of the 14 and 22 of all 42 (whole passages: 30): a line alone loses the context that
tells this model which value answers, and it restates the question or copies a passage's header
line more often. The demo does not use it; it is an option for models that read better.

Words are compared loosely (lower case, split on anything not a letter or digit, so
``LOGIN_FAILURE_LIMIT`` gives ``login``, ``failure``, ``limit``; two words match when they are
equal or share their first :data:`PREFIX` letters, so "failed" matches "failures"); English
function words and question words (:data:`STOPWORDS`) do not count. Nothing here knows the
documents or the questions: it is the same for any knowledge base.

The citations the run keeps (and the chat app shows) are the whole passages; only the model's
input is cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PREFIX = 4
"""Two words of at least this many letters match when their first ``PREFIX`` letters do."""
MAX_LINES = 2
"""Lines kept per passage at most (the best scoring, in the passage's own order)."""
MAX_LINE_CHARS = 600
"""A kept line longer than this is cut (on a word boundary, with "…")."""
SLACK = 1
"""A line is kept when it scores at least the passage's best score minus ``SLACK``."""

STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having here how i if in
into is it its itself just may me might more most much must my no nor not now of off on once one only or other
our out over own same shall she should so some such than that the their them then there these they this those
through to too under until up very was we were what when where which while who whom why will with would you
your yours per many
""".split())
"""Words that say nothing about what a line is about (English function and question words)."""

_WORD = re.compile(r"[a-z0-9]+")
_BLOCK_START = re.compile(r"[|#>]|[-*+] |\d+[.)] ")
"""A line that starts a unit of its own: a table row, a heading, a quote, a list item."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*\[(])")


def words(text: str) -> list[str]:
    """The words of ``text`` that count: lower case, letters and digits, no stopwords."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


def _key(word: str) -> str:
    return word[:PREFIX] if len(word) >= PREFIX else word


def query_keys(query: str) -> frozenset[str]:
    """The match keys of the question's words (see the module's docstring)."""
    return frozenset(_key(w) for w in words(query))


def lines(text: str) -> list[str]:
    """``text`` as lines: a table row, a list item or a heading is one; the lines of a
    paragraph (Markdown wraps it) are joined, then cut into sentences."""
    units: list[str] = []
    joinable = False  # whether the last unit is prose a wrapped line continues
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("```"):
            joinable = False
            continue
        if _BLOCK_START.match(line):
            units.append(line)
            joinable = not line.startswith(("|", "#"))  # a list item may wrap too
        elif joinable:
            units[-1] = f"{units[-1]} {line}"
        else:
            units.append(line)
            joinable = True
    return [s.strip() for unit in units for s in _SENTENCE_END.split(unit) if s.strip()]


def line_score(line: str, keys: frozenset[str]) -> int:
    """How many of the question's match keys ``line`` holds (each counted once)."""
    return len(keys & {_key(w) for w in words(line)})


def _cut(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS].rsplit(" ", 1)[0] + " …"


def focus_text(text: str, keys: frozenset[str]) -> tuple[str, int]:
    """``text`` cut to its best lines for ``keys``, and their best score.

    Returns:
        ``(focused, score)``: the at most :data:`MAX_LINES` lines of the highest scores (a line
        is kept when it scores at least the passage's best score minus one, and at least 1), in
        their order in ``text``, joined by newlines; ``score`` is the best line's. A passage no
        line of which shares a word with the question is returned whole with score 0 (it was
        found by meaning, not by words: the model may still need it).
    """
    found = lines(text)
    scores = [line_score(line, keys) for line in found]
    best = max(scores, default=0)
    if best == 0:
        return text.strip(), 0
    floor = max(1, best - SLACK)
    ranked = sorted((i for i, s in enumerate(scores) if s >= floor), key=lambda i: (-scores[i], i))[:MAX_LINES]
    return "\n".join(_cut(found[i]) for i in sorted(ranked)), best


def focus_passages(texts: Iterable[str], query: str) -> list[str]:
    """Each passage of ``texts`` cut to its lines about ``query`` (:func:`focus_text`), in order."""
    keys = query_keys(query)
    if not keys:
        return [t.strip() for t in texts]
    return [focus_text(t, keys)[0] for t in texts]
