"""Text decoding/encoding: BOMs, encodings, line endings, binary detection (pure, table-driven)."""

from __future__ import annotations

import codecs

import pytest

from serve.errors import FS_STATUS
from serve.workspaces.files import WorkspaceFsError
from serve.workspaces.files.textio import (
    BINARY_PROBE_BYTES,
    apply_line_ending,
    decode_text,
    detect_line_style,
    encode_text,
    looks_binary,
    normalize_encoding,
    supports_bom,
    wire_line_ending,
)

DECODE_CASES: list[tuple[bytes, str, str, bool]] = [
    # raw bytes, text, encoding, bom
    (b"", "", "utf-8", False),
    (b"plain\n", "plain\n", "utf-8", False),
    ("héllo\n".encode(), "héllo\n", "utf-8", False),
    (codecs.BOM_UTF8 + b"x\r\n", "x\r\n", "utf-8", True),
    (codecs.BOM_UTF16_LE + "hi\r\n€".encode("utf-16-le"), "hi\r\n€", "utf-16le", True),
    (codecs.BOM_UTF16_BE + "hi\n€".encode("utf-16-be"), "hi\n€", "utf-16be", True),
    (codecs.BOM_UTF32_LE + "z\n".encode("utf-32-le"), "z\n", "utf-32le", True),
    (codecs.BOM_UTF32_BE + "z\n".encode("utf-32-be"), "z\n", "utf-32be", True),
    (b"caf\xe9\n", "caf\xe9\n", "iso-8859-1", False),
    (b"\xff\xfeA", "\xff\xfeA", "iso-8859-1", False),  # UTF-16 BOM, odd length: not UTF-16
]


@pytest.mark.parametrize(("raw", "text", "encoding", "bom"), DECODE_CASES)
def test_decode_then_encode_round_trips_bytes(
    raw: bytes, text: str, encoding: str, bom: bool
) -> None:
    decoded = decode_text(raw)
    assert (decoded.text, decoded.encoding, decoded.bom) == (text, encoding, bom)
    assert encode_text(decoded.text, decoded.encoding, decoded.bom) == raw


LINE_CASES: list[tuple[str, str, str]] = [
    ("", "none", "lf"),
    ("one line", "none", "lf"),
    ("a\nb\n", "lf", "lf"),
    ("a\r\nb\r\n", "crlf", "crlf"),
    ("a\r\nb\nc\r\n", "mixed", "crlf"),
    ("a\nb\nc\r\n", "mixed", "lf"),
    ("a\r\nb\n", "mixed", "lf"),
    ("old mac\rstyle", "none", "lf"),
]


@pytest.mark.parametrize(("text", "style", "wire"), LINE_CASES)
def test_line_style(text: str, style: str, wire: str) -> None:
    assert detect_line_style(text) == style
    assert wire_line_ending(text) == wire


def test_apply_line_ending() -> None:
    assert apply_line_ending("a\nb\r\nc", "crlf") == "a\r\nb\r\nc"
    assert apply_line_ending("a\nb\r\nc", "lf") == "a\nb\nc"
    assert apply_line_ending("keep\rlone", "crlf") == "keep\rlone"


BINARY_CASES: list[tuple[bytes, bool]] = [
    (b"", False),
    (b"text\n", False),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", True),
    (b"abc\x00def", True),
    (bytes(range(1, 9)) * 10, True),  # mostly control bytes
    (b"\t\n\r\x0b\x0c" * 100, False),  # whitespace controls are text
    (codecs.BOM_UTF16_LE + "hi".encode("utf-16-le"), False),  # NULs, but a BOM
    ("hi".encode("utf-16-le"), True),  # UTF-16 without BOM reads as binary
    (b"a" * BINARY_PROBE_BYTES + b"\x00", False),  # NUL beyond the probe
]


@pytest.mark.parametrize(("raw", "binary"), BINARY_CASES)
def test_looks_binary(raw: bytes, binary: bool) -> None:
    assert looks_binary(raw) is binary


def test_encoding_names_and_bom_support() -> None:
    assert normalize_encoding("UTF8") == "utf-8"
    assert normalize_encoding("latin1") == "iso-8859-1"
    assert normalize_encoding("UTF-16LE") == "utf-16le"
    assert supports_bom("utf-8") and not supports_bom("latin-1")
    for bad in ("rot13", "base64", "nope"):
        with pytest.raises(WorkspaceFsError) as info:
            normalize_encoding(bad)
        assert info.value.kind == "parse_error"


@pytest.mark.parametrize(
    ("text", "encoding", "bom"),
    [("€", "latin-1", False), ("x", "iso-8859-1", True), ("\ud800", "utf-8", False)],
)
def test_unencodable_is_parse_error(text: str, encoding: str, bom: bool) -> None:
    with pytest.raises(WorkspaceFsError) as info:
        encode_text(text, encoding, bom)
    assert info.value.kind == "parse_error"
    assert FS_STATUS[info.value.kind] == 400
