"""Passage text made safe to show on a terminal.

Passages are data from files the user indexed, and model output may echo them.
Printed raw, an ANSI escape in a passage clears the screen, sets the window
title or rewrites what is on screen. `printable` removes every escape sequence
and every other C0/C1 control character (tab and newline are kept), plus the
Unicode bidirectional overrides that reorder what a line appears to say.

Rich's emoji codes (`:x:` becomes an emoji, so `root:x:0:0` would print as
`root❌0:0`) are turned off in the CLI consoles (`cli/common.py`); the chat
app builds its widgets from plain `Text`/`Content`, which never read them.
"""

from __future__ import annotations

import re

# ESC-introduced sequences: CSI (ESC [ params final), OSC/DCS/SOS/PM/APC strings (ended by BEL or
# ESC \, or cut off at the end of the text), and two-byte escapes. The 8-bit forms (U+009B CSI,
# U+009D OSC, ...) are C1 controls and go with the character class below.
_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"                   # CSI
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"   # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?")                         # other escapes (and a lone ESC)
# C0 but tab and newline, DEL, C1, and the bidi embeddings, overrides and isolates.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` without terminal escape sequences and control characters (tab and newline kept)."""
    if text.isprintable():  # the common case: nothing to do (tab and newline are not "printable")
        return text
    return _CONTROL.sub("", _SEQUENCE.sub("", text))


def not_utf8(text: str, argv: bool = False) -> str | None:
    """Where `text` cannot be written as UTF-8, said for an error message, or None when it can.

    Such text holds lone surrogates: JSON's "\\ud800" escapes decode to them, and so do command-line
    bytes that were not UTF-8 (Python keeps byte 0xff as U+DCFF, so `argv` names the byte). No
    tokenizer, engine or UTF-8 file takes one, so every input checks this before work starts.
    """
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        char = ord(text[e.start])
        what = (f"byte 0x{char - 0xDC00:02x}" if argv and 0xDC80 <= char <= 0xDCFF
                else f"a lone surrogate (U+{char:04X})")
        return f"{what} at character {e.start + 1}"
