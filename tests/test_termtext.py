"""`printable`: passage text without terminal escapes or control characters."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dgpo_edge.termtext import printable

HOSTILE = ("root:x:0:0 \x1b]0;pwned title\x07before \x1b[2J\x1b[31mred\x1b[0m after\r over\x08\x9b2J"
           " \x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\ \u202eevil\u202c\tend\n")


def test_escapes_and_controls_are_removed_text_is_kept():
    assert printable(HOSTILE) == "root:x:0:0 before red after over2J link evil\tend\n"


def test_plain_text_is_returned_as_is():
    text = "Lima — the capital: 10 ≤ x < 20 :x: 🙂 naïve\tcol\nline"
    assert printable(text) is text or printable(text) == text


def test_an_unterminated_sequence_at_the_end_is_dropped():
    assert printable("title\x1b]0;never ends") == "title"
    assert printable("a\x1b[") == "a" and printable("a\x1b") == "a"


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_no_control_character_survives(text):
    out = printable(text)
    assert "\x1b" not in out
    assert all(c in "\t\n" or not (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f) for c in out)
    assert not set(out) & set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
