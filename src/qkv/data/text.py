"""Text checks shared by the command lines."""

from __future__ import annotations

__all__ = ["utf8_problem"]


def utf8_problem(text: str) -> tuple[str, int] | None:
    """Where ``text`` is not UTF-8, or None: ``("byte 0xff", index)``.

    Python keeps command-line bytes that are not UTF-8 as lone surrogates (``\\udcff`` for
    byte 0xff), which no tokenizer takes and no page can hold; other lone surrogates are
    named by their code point (``U+D800``).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        return what, err.start
    return None
