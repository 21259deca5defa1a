"""Passage focus (knowledge.focus): a passage cut to its lines about the question: the line
that holds the question's words is kept, its neighbours (another row of the same table, another
sentence of the paragraph) are not; loose word matching; a passage that shares no word with the
question is kept whole. No database."""

from __future__ import annotations

from knowledge.focus import MAX_LINES, focus_passages, focus_text, lines, query_keys

SETTINGS_TABLE = """| Setting | Default | What it does |
|---|---|---|
| `SEARCH_RATE` | `120/minute` | Knowledge searches one user may make. |
| `MESSAGE_RATE` | `30/minute` | Messages one user may post in a chat. |
| `TOKEN_RATE` | `20/hour` | API tokens a user may create. |"""


def test_the_row_about_the_question_is_kept_and_its_neighbours_are_not():
    [focused] = focus_passages([SETTINGS_TABLE], "How many messages may one user post per minute by default?")

    assert "`30/minute`" in focused
    assert "120/minute" not in focused and "20/hour" not in focused


def test_a_paragraph_is_cut_into_sentences_and_only_the_one_about_the_question_stays():
    text = ("The boathouse opens at 8 in the morning. The kitchen closes at ten at night. "
            "Dinghies are kept in the blue boathouse next to the slipway.")

    [focused] = focus_passages([text], "Where are the dinghies kept?")

    assert focused == "Dinghies are kept in the blue boathouse next to the slipway."


def test_words_match_loosely_identifiers_split_and_prefixes():
    keys = query_keys("After how many failed logins is an account locked out?")

    # "failed" / "failures", "logins" / "LOGIN_…", "locked" / "lockout": the first four letters.
    [focused] = focus_passages(["`LOGIN_FAILURE_LIMIT`: 10 failures before the lockout.\nOther text here."],
                               "After how many failed logins is an account locked out?")
    assert {"fail", "logi", "lock", "acco"} <= keys and "after" not in keys and "many" not in keys
    assert focused == "`LOGIN_FAILURE_LIMIT`: 10 failures before the lockout."


def test_a_passage_without_a_shared_word_is_kept_whole_and_a_question_of_stopwords_changes_nothing():
    text = "First line.\nSecond line."

    assert focus_text(text, query_keys("Where are the dinghies kept?")) == (text, 0)
    assert focus_passages([f"  {text}  "], "What is it?") == [text]


def test_at_most_max_lines_are_kept_in_their_own_order():
    text = "\n".join(f"Line {i} about boats." for i in range(MAX_LINES + 3))

    focused, score = focus_text(text, query_keys("boats"))

    assert score == 1
    assert focused.splitlines() == [f"Line {i} about boats." for i in range(MAX_LINES)]


def test_lines_split_paragraphs_at_sentence_ends_but_not_inside_numbers_or_paths():
    assert lines("It is 2.5 MB. See `docs/api.md` for more.\n\n- a list item") == [
        "It is 2.5 MB.", "See `docs/api.md` for more.", "- a list item"]


def test_a_wrapped_paragraph_is_joined_before_it_is_cut_and_rows_and_items_stay_apart():
    text = ("Visitors pay 12 euros a night. Dinghies are kept in the\nblue boathouse. The fuel\npontoon closes at noon.\n"
            "- an item that\n  wraps\n| a | row |\n| b | row |\n## Heading\nProse again.")

    assert lines(text) == ["Visitors pay 12 euros a night.", "Dinghies are kept in the blue boathouse.",
                           "The fuel pontoon closes at noon.", "- an item that wraps", "| a | row |", "| b | row |",
                           "## Heading", "Prose again."]
