"""Tests for run-engine gaps found by mutation testing (scripts/mutation.sh, target run-engine).

Each test here kills a mutant that survived, or that no test of the target reached, in a sampled
run (MUTATION_SAMPLE); the mutant is named in the test's docstring so the gap can be re-checked:
``cd $MUTATION_DIR/run-engine/mutants && MUTANT_UNDER_TEST=<name> pytest <this file>`` fails.
"""

from __future__ import annotations

import json

from sessions.runner.compression import (
    COMPRESS_MIN_CHARS,
    KEPT_ARRAY_ITEMS,
    MAX_ARRAY_ITEMS,
    MAX_DEPTH,
    MAX_STRING_CHARS,
    STRING_HEAD_CHARS,
    STRING_TAIL_CHARS,
    compress_json_value,
    compress_result,
)


def test_an_array_of_at_most_max_array_items_reaches_the_model_whole():
    """An array is sampled only when it is longer than MAX_ARRAY_ITEMS; one of exactly that
    many items loses nothing (mutants compress_json_value__mutmut_27, always sampled, and
    __mutmut_28, ``>=``, cut it to KEPT_ARRAY_ITEMS without saying so)."""
    exact = list(range(MAX_ARRAY_ITEMS))
    assert compress_json_value(exact) == exact
    assert compress_json_value(exact[:3]) == exact[:3]


def test_a_longer_array_keeps_its_first_items_and_says_how_many_were_left_out():
    longer = list(range(MAX_ARRAY_ITEMS + 1))
    left_out = len(longer) - KEPT_ARRAY_ITEMS
    assert compress_json_value(longer) == [
        *range(KEPT_ARRAY_ITEMS), f"… {left_out} more items ({len(longer)} in all)"
    ]


def test_nesting_deeper_than_max_depth_becomes_a_stub_and_shallower_stays():
    deep: object = "leaf"
    for _ in range(MAX_DEPTH):
        deep = {"k": deep}
    assert compress_json_value(deep) == deep  # MAX_DEPTH levels of objects: all kept
    deeper = {"k": deep}
    inner = compress_json_value(deeper)
    for _ in range(MAX_DEPTH):
        inner = inner["k"]
    assert inner == "{… object with 1 keys}"


def test_a_long_string_keeps_its_head_and_tail_and_a_string_at_the_limit_is_whole():
    at_limit = "x" * MAX_STRING_CHARS
    assert compress_json_value(at_limit) == at_limit
    long = "h" * STRING_HEAD_CHARS + "m" * MAX_STRING_CHARS + "t" * STRING_TAIL_CHARS
    cut = compress_json_value(long)
    assert cut.startswith("h" * STRING_HEAD_CHARS) and cut.endswith("t" * STRING_TAIL_CHARS)
    assert len(cut) < len(long) and "m" * MAX_STRING_CHARS not in cut


def test_compress_result_leaves_short_and_non_json_results_alone_and_compresses_long_json():
    short = json.dumps(list(range(MAX_ARRAY_ITEMS * 3)))
    assert len(short) < COMPRESS_MIN_CHARS and compress_result(short) == short
    text = "not json " * (COMPRESS_MIN_CHARS // 8)
    assert compress_result(text) == text
    long = json.dumps([{"n": i, "pad": "p" * 40} for i in range(200)])
    assert len(long) >= COMPRESS_MIN_CHARS
    sent = json.loads(compress_result(long))
    assert sent[:KEPT_ARRAY_ITEMS] == json.loads(long)[:KEPT_ARRAY_ITEMS]
    assert sent[-1] == f"… {200 - KEPT_ARRAY_ITEMS} more items (200 in all)"
