"""Text decoding and encoding for workspace files: BOM, encoding, line endings, binary.

Pure functions over ``bytes``/``str``; no I/O. Used by :mod:`serve.workspaces.files.contents` to
turn a file's raw bytes into the text a client sees, and to turn the text a client sends
back into bytes with the file's own profile (encoding, BOM, line endings) preserved.

Decoding (:func:`decode_text`), first rule that applies wins:

1. empty → ``utf-8``, no BOM;
2. a Unicode BOM (UTF-8 ``EF BB BF``, UTF-32 LE/BE, UTF-16 LE/BE; UTF-32 LE is tested
   before UTF-16 LE because its BOM starts with the UTF-16 LE one) → that encoding,
   ``bom=True``, BOM stripped from the text;
3. valid UTF-8 → ``utf-8``;
4. otherwise ``iso-8859-1`` (latin-1). Latin-1 maps every byte to one code point, so the
   text round-trips to the *identical* bytes on write-back: a file in an encoding we do
   not detect (the reference uses chardet + iconv for GBK/Shift_JIS/…) is never
   corrupted by an edit, only shown as mojibake. A BOM-marked file that fails to decode
   strictly in its BOM's encoding also falls back here, BOM bytes included in the text.

The text keeps its line endings verbatim (no newline translation): ``\\r\\n`` stays in the
string, so an edit touches only the replaced span and a mixed-ending file survives
byte-for-byte. :func:`detect_line_style` classifies the breaks as ``lf``, ``crlf``,
``mixed`` or ``none``; the wire ``lineEnding`` (only ``"lf" | "crlf"``) is the majority
style (:func:`wire_line_ending`; ties and ``none`` report ``lf``).

Binary detection (:func:`looks_binary`), as the reference does: a buffer that starts with
a Unicode BOM is text; otherwise a NUL byte in the first :data:`BINARY_PROBE_BYTES` bytes,
or more than :data:`BINARY_CONTROL_RATIO` of them being C0 control bytes other than
``\\t \\n \\v \\f \\r``, means binary. UTF-16 without a BOM therefore reads as binary.

Encoding back (:func:`encode_text`) takes an encoding from :data:`WRITABLE_ENCODINGS`
(an allowlist: Python also "knows" codecs such as ``rot13`` that must not reach a file)
and a BOM flag; characters the encoding cannot represent raise ``parse_error``.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from typing import Final, Literal

import msgspec

from serve.workspaces.files.errors import make_error

__all__ = [
    "BINARY_CONTROL_RATIO",
    "BINARY_PROBE_BYTES",
    "WRITABLE_ENCODINGS",
    "DecodedText",
    "LineEnding",
    "LineStyle",
    "apply_line_ending",
    "decode_text",
    "detect_line_style",
    "encode_text",
    "looks_binary",
    "normalize_encoding",
    "supports_bom",
    "wire_line_ending",
]

LineEnding = Literal["lf", "crlf"]
LineStyle = Literal["lf", "crlf", "mixed", "none"]

#: Bytes sampled from the start of a file by :func:`looks_binary` (4 KiB, as the reference).
BINARY_PROBE_BYTES: Final = 4 * 1024
#: Fraction of control bytes in the probe above which a file is binary.
BINARY_CONTROL_RATIO: Final = 0.3

# BOMs in detection order: UTF-32 LE (FF FE 00 00) before UTF-16 LE (FF FE).
_BOMS: Final[tuple[tuple[bytes, str], ...]] = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF32_LE, "utf-32le"),
    (codecs.BOM_UTF32_BE, "utf-32be"),
    (codecs.BOM_UTF16_LE, "utf-16le"),
    (codecs.BOM_UTF16_BE, "utf-16be"),
)
_BOM_BY_ENCODING: Final[Mapping[str, bytes]] = {name: bom for bom, name in _BOMS}

#: Canonical encoding name → Python codec. These are the names the module reports and
#: accepts (see :func:`normalize_encoding` for the accepted aliases).
WRITABLE_ENCODINGS: Final[Mapping[str, str]] = {
    "utf-8": "utf-8",
    "utf-16le": "utf-16-le",
    "utf-16be": "utf-16-be",
    "utf-32le": "utf-32-le",
    "utf-32be": "utf-32-be",
    "iso-8859-1": "latin-1",
    "windows-1252": "cp1252",
    "gb18030": "gb18030",
    "gbk": "gbk",
    "big5": "big5",
    "shift_jis": "shift_jis",
    "euc-jp": "euc_jp",
    "euc-kr": "euc_kr",
}

_ALIASES: Final[Mapping[str, str]] = {
    "utf8": "utf-8",
    "utf-8-sig": "utf-8",
    "utf16le": "utf-16le",
    "utf-16-le": "utf-16le",
    "utf16be": "utf-16be",
    "utf-16-be": "utf-16be",
    "utf32le": "utf-32le",
    "utf-32-le": "utf-32le",
    "utf32be": "utf-32be",
    "utf-32-be": "utf-32be",
    "latin1": "iso-8859-1",
    "latin-1": "iso-8859-1",
    "iso8859-1": "iso-8859-1",
    "iso_8859_1": "iso-8859-1",
    "cp1252": "windows-1252",
    "shift-jis": "shift_jis",
    "sjis": "shift_jis",
    "eucjp": "euc-jp",
    "euckr": "euc-kr",
}

_FALLBACK_ENCODING: Final = "iso-8859-1"
# C0 controls counted as "non-printable" by the binary probe: everything below 0x20
# except \t \n \v \f \r (0x09-0x0D).
_CONTROL_BYTES: Final = frozenset(range(0x00, 0x09)) | frozenset(range(0x0E, 0x20))


class DecodedText(msgspec.Struct, frozen=True):
    """A file's text and the profile needed to write it back unchanged."""

    text: str
    encoding: str
    bom: bool
    line_style: LineStyle

    @property
    def line_ending(self) -> LineEnding:
        """The wire ``lineEnding`` for this text (majority style)."""
        return wire_line_ending(self.text)


def looks_binary(data: bytes) -> bool:
    """True when ``data`` (a file's first bytes, or all of them) should be treated as binary."""
    if not data:
        return False
    if any(data.startswith(bom) for bom, _ in _BOMS):
        return False
    probe = data[:BINARY_PROBE_BYTES]
    if b"\x00" in probe:
        return True
    controls = sum(1 for byte in probe if byte in _CONTROL_BYTES)
    return controls / len(probe) > BINARY_CONTROL_RATIO


def decode_text(data: bytes) -> DecodedText:
    """Decode a whole file's bytes (see the module docstring for the rules)."""
    if not data:
        return DecodedText("", "utf-8", False, "none")
    for bom, name in _BOMS:
        if data.startswith(bom):
            try:
                text = data[len(bom) :].decode(WRITABLE_ENCODINGS[name], errors="strict")
            except UnicodeDecodeError:
                break
            return DecodedText(text, name, True, detect_line_style(text))
    else:
        try:
            text = data.decode("utf-8", errors="strict")
        except UnicodeDecodeError:
            pass
        else:
            return DecodedText(text, "utf-8", False, detect_line_style(text))
    text = data.decode("latin-1")
    return DecodedText(text, _FALLBACK_ENCODING, False, detect_line_style(text))


def _count_breaks(text: str) -> tuple[int, int]:
    crlf = text.count("\r\n")
    return crlf, text.count("\n") - crlf


def detect_line_style(text: str) -> LineStyle:
    """Classify the ``\\n`` line breaks of ``text`` (a lone ``\\r`` is not a break)."""
    crlf, lf = _count_breaks(text)
    if crlf and lf:
        return "mixed"
    if crlf:
        return "crlf"
    if lf:
        return "lf"
    return "none"


def wire_line_ending(text: str) -> LineEnding:
    """The wire ``lineEnding``: ``crlf`` when CRLF breaks outnumber bare LF, else ``lf``."""
    crlf, lf = _count_breaks(text)
    return "crlf" if crlf > lf else "lf"


def apply_line_ending(text: str, ending: LineEnding) -> str:
    """Rewrite every line break of ``text`` as ``ending`` (lone ``\\r`` untouched)."""
    lf_text = text.replace("\r\n", "\n")
    return lf_text if ending == "lf" else lf_text.replace("\n", "\r\n")


def normalize_encoding(name: str) -> str:
    """Canonical name for a client-supplied encoding, or ``parse_error``."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in WRITABLE_ENCODINGS:
        raise make_error(
            "parse_error",
            f"unsupported encoding {name!r}",
            "use one of: " + ", ".join(WRITABLE_ENCODINGS),
        )
    return key


def supports_bom(encoding: str) -> bool:
    """True when ``encoding`` (canonical or alias) has a Unicode byte order mark."""
    return normalize_encoding(encoding) in _BOM_BY_ENCODING


def encode_text(text: str, encoding: str, bom: bool) -> bytes:
    """Encode ``text`` in ``encoding`` (a canonical or alias name), optionally with a BOM.

    A BOM is only written for Unicode encodings; asking for one with another encoding is
    a ``parse_error``, as are characters the encoding cannot represent (including lone
    surrogates, which JSON can smuggle in as ``"\\ud800"``).
    """
    name = normalize_encoding(encoding)
    prefix = b""
    if bom:
        if name not in _BOM_BY_ENCODING:
            raise make_error("parse_error", f"encoding {name!r} has no byte order mark")
        prefix = _BOM_BY_ENCODING[name]
    try:
        return prefix + text.encode(WRITABLE_ENCODINGS[name], errors="strict")
    except UnicodeEncodeError as err:
        bad = text[err.start : min(err.end, err.start + 8)]
        raise make_error(
            "parse_error",
            f"content cannot be encoded as {name}: {bad!r} at index {err.start}",
            "write the file as utf-8, or remove the characters the encoding lacks",
        ) from None
