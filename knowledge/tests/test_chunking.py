"""The recursive chunker on its own (no database)."""

from __future__ import annotations

import pytest

from knowledge.chunking import ChunkDraft, chunk_index_text, chunk_sections, split_text
from knowledge.parsing import Section

pytestmark = pytest.mark.usefixtures("all_tenants_scope")


def _sentences(n: int, words: int = 12) -> str:
    return " ".join(f"Sentence {i} " + " ".join(f"w{i}x{j}" for j in range(words)) + "." for i in range(n))


def test_short_text_is_one_chunk():
    assert split_text("One short paragraph.", size=500, overlap=50) == ["One short paragraph."]


def test_paragraphs_are_kept_whole_when_they_fit():
    paragraphs = [f"Paragraph {i}. " + "word " * 40 for i in range(6)]  # ~250 characters each
    chunks = split_text("\n\n".join(p.strip() for p in paragraphs), size=600, overlap=0)
    assert all(len(c) <= 600 for c in chunks)
    # each paragraph lies entirely in one chunk: the splitter cut at blank lines, not inside them
    for p in paragraphs:
        assert any(p.strip() in c for c in chunks), p[:20]


def test_a_long_paragraph_is_split_at_sentence_ends():
    text = _sentences(20)  # one paragraph of ~2,000 characters
    chunks = split_text(text, size=500, overlap=0)
    assert len(chunks) >= 4
    assert all(len(c) <= 500 for c in chunks)
    assert all(c.endswith(".") for c in chunks)  # no sentence cut in the middle
    assert " ".join(chunks) == text


def test_overlap_repeats_the_end_of_the_previous_chunk_at_a_word_boundary():
    text = _sentences(20)
    chunks = split_text(text, size=500, overlap=50)
    assert all(len(c) <= 500 for c in chunks)
    for before, after in zip(chunks, chunks[1:], strict=False):
        # the next chunk starts with a whole-word tail of the previous one, 1…50 characters long
        shared = next(n for n in range(min(len(before), len(after)), 0, -1) if before.endswith(after[:n]))
        assert 10 <= shared <= 50, (before[-60:], after[:60])
        assert before[-shared - 1] == " "
    assert split_text(text, size=500, overlap=0)[1][:20] not in chunks[0]


def test_an_indented_continuation_line_after_the_overlap_keeps_its_space():
    # A list item wrapped onto an indented line, cut where the wrapped line starts: the next
    # chunk is the overlap tail, then that line. Its indentation was stripped with no space put
    # back, gluing "every" to "attempt" (seen in the demo knowledge base: "on everyattempt").
    item = "- **Idempotency**: " + "word " * 80 + "the same on every\n  attempt of one event: use it to ignore duplicates."
    chunks = split_text(item, size=450, overlap=50)
    assert len(chunks) == 2
    assert "everyattempt" not in chunks[1] and "every attempt of one event" in chunks[1]


def test_a_table_cut_across_chunks_repeats_its_header_in_each():
    header = "| variable | default | what |\n|---|---:|---|"
    rows = [f"| `SETTING_{i}` | `{i * 10}` | what setting {i} does, in a few words |" for i in range(40)]
    text = "The settings:\n\n" + header + "\n" + "\n".join(rows) + "\n\nAfter the table."
    chunks = split_text(text, size=500, overlap=50)
    assert len(chunks) > 3 and all(len(c) <= 500 for c in chunks)
    in_table = [c for c in chunks if "SETTING_" in c]
    assert all(c.startswith(header + "\n| `SETTING_") for c in in_table[1:]), [c[:80] for c in in_table]
    # every row whole in exactly one chunk, in order; the text after the table is kept
    assert [row for c in chunks for row in c.splitlines() if row.startswith("| `SETTING_")] == rows
    assert chunks[-1].endswith("After the table.")


def test_a_table_header_longer_than_half_a_chunk_is_not_repeated():
    # 12 columns: a header of ~180 characters, more than half of 300 but room left for rows
    # beside it, so only the half-a-chunk rule keeps it from being repeated
    header = "| " + " | ".join(f"column {i}" for i in range(12)) + " |\n|" + "---|" * 12
    assert 150 < len(header) < 250
    rows = "\n".join(f"| row {i} |" + " x |" * 11 for i in range(20))
    chunks = split_text(header + "\n" + rows, size=300, overlap=30)
    assert len(chunks) > 2 and all(len(c) <= 300 for c in chunks)
    assert sum("column 1 |" in c for c in chunks) == 1


def test_text_without_separators_falls_back_to_fixed_windows():
    text = "x" * 1234
    chunks = split_text(text, size=500, overlap=0)
    assert [len(c) for c in chunks] == [500, 500, 234]
    with_overlap = split_text(text, size=500, overlap=50)
    assert all(len(c) <= 500 for c in with_overlap) and "".join(with_overlap).count("x") >= 1234


def test_chunks_never_cross_sections_and_keep_their_heading_path():
    sections = [
        Section(("Guide",), "Intro text."),
        Section(("Guide", "Install"), _sentences(10)),
        Section(("Guide", "Use"), "Short use."),
    ]
    drafts = chunk_sections(sections, size=300, overlap=30)
    assert [d.position for d in drafts] == list(range(len(drafts)))
    assert drafts[0] == ChunkDraft(0, ("Guide",), "Intro text.")
    assert drafts[-1] == ChunkDraft(len(drafts) - 1, ("Guide", "Use"), "Short use.")
    install = [d for d in drafts if d.headings == ("Guide", "Install")]
    assert len(install) >= 3
    assert install[0].heading == "Guide > Install"
    assert "Short use" not in " ".join(d.text for d in install)


def test_the_heading_path_is_part_of_what_is_embedded():
    assert chunk_index_text("Guide > Install", "pip install x") == "Guide > Install\n\npip install x"
    assert chunk_index_text("", "plain") == "plain"


@pytest.mark.parametrize(("size", "overlap"), [(50, 0), (9000, 0), (500, 251), (500, -1)])
def test_size_and_overlap_are_checked(size, overlap):
    with pytest.raises(ValueError, match="chunk"):
        chunk_sections([Section((), "text")], size=size, overlap=overlap)
