"""Bearer token resolution, the Authorization check, and redaction."""

from __future__ import annotations

import base64
import hmac
import io
import logging

import pytest

from serve.http.security.bearer import (
    ARGV_TOKEN_WARNING,
    MAX_TOKEN_CHARS,
    REDACTED,
    UNAUTHORIZED_BODY,
    BearerAuth,
    InvalidBearerToken,
    RedactingFilter,
    check_authorization,
    generate_token,
    redact,
    resolve_startup_token,
    resolve_token,
    token_digest,
)

ENV = "QWEN_SERVER_TOKEN"

# --------------------------------------------------------------------------- resolution


@pytest.mark.parametrize(
    ("flag", "env", "token"),
    [
        (None, {}, None),
        ("tok", {}, "tok"),
        (None, {ENV: "envtok"}, "envtok"),
        ("flagtok", {ENV: "envtok"}, "flagtok"),
        ("", {ENV: "envtok"}, None),  # an explicitly empty flag still wins
        ("   ", {ENV: "envtok"}, None),
        ("  tok \n", {}, "tok"),
        (None, {ENV: "\ttok\r\n"}, "tok"),
        (None, {ENV: "\ufefftok"}, "tok"),
        (None, {ENV: ""}, None),
        (None, {ENV: " \t\n"}, None),
        ("a b", {}, "a b"),  # inner whitespace is part of the token
        (None, {"OTHER": "x"}, None),
    ],
)
def test_resolve_token(flag: str | None, env: dict[str, str], token: str | None) -> None:
    assert resolve_token(flag, env) == token


@pytest.mark.parametrize(
    ("flag", "env", "source"),
    [
        ("tok\x00en", {}, "--token"),
        ("tok\x1ben", {}, "--token"),
        ("tok\nen", {}, "--token"),
        (None, {ENV: "tök"}, ENV),
        (None, {ENV: "tok\u200ben"}, ENV),
        ("x" * (MAX_TOKEN_CHARS + 1), {}, "--token"),
    ],
)
def test_resolve_token_refuses_unusable_tokens_without_echoing_them(
    flag: str | None, env: dict[str, str], source: str
) -> None:
    with pytest.raises(InvalidBearerToken) as info:
        resolve_token(flag, env)
    message = str(info.value)
    assert source in message
    raw = flag if flag is not None else env[ENV]
    assert raw.strip() not in message


def test_longest_token_accepted() -> None:
    assert resolve_token("x" * MAX_TOKEN_CHARS, {}) == "x" * MAX_TOKEN_CHARS


@pytest.mark.parametrize(
    ("flag", "env", "loopback", "expect"),
    [
        # (token, source, generated, argv_warning); token "GEN" = any generated token
        (None, {}, True, (None, None, False, False)),
        (None, {}, False, ("GEN", "generated", True, False)),
        ("", {}, False, (None, None, False, False)),  # explicitly empty: no generation
        (None, {ENV: ""}, False, (None, None, False, False)),
        (None, {ENV: "  "}, False, (None, None, False, False)),
        ("tok", {}, True, ("tok", "--token", False, True)),
        ("tok", {}, False, ("tok", "--token", False, True)),
        (None, {ENV: "e"}, False, ("e", ENV, False, False)),
        ("f", {ENV: "e"}, True, ("f", "--token", False, True)),
    ],
)
def test_resolve_startup_token(
    flag: str | None,
    env: dict[str, str],
    loopback: bool,
    expect: tuple[str | None, str | None, bool, bool],
) -> None:
    result = resolve_startup_token(flag, env, loopback_bind=loopback)
    token, source, generated, argv_warning = expect
    if token == "GEN":
        assert result.token is not None and len(result.token) == 22
    else:
        assert result.token == token
    assert (result.source, result.generated, result.argv_warning) == (
        source,
        generated,
        argv_warning,
    )
    if result.token is not None:
        assert "token='[redacted]'" in repr(result)


def test_token_resolution_repr_hides_token() -> None:
    result = resolve_startup_token("zebra-unique-42", {}, loopback_bind=True)
    assert "zebra-unique-42" not in repr(result)


def test_argv_warning_mentions_env_var() -> None:
    assert ENV in ARGV_TOKEN_WARNING and "--token" in ARGV_TOKEN_WARNING


def test_generate_token_shape_and_uniqueness() -> None:
    tokens = {generate_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert len(token) == 22
        assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        assert len(base64.urlsafe_b64decode(token + "==")) == 16
        assert resolve_token(token, {}) == token  # a generated token is always usable


# --------------------------------------------------------------------------- checking

TOKEN = "s3cr3t-T0ken_value"
DIGEST = token_digest(TOKEN)

AUTH_CASES: list[tuple[list[str], bool]] = [
    ([f"Bearer {TOKEN}"], True),
    ([f"bearer {TOKEN}"], True),
    ([f"BEARER {TOKEN}"], True),
    ([f"BeArEr {TOKEN}"], True),
    ([f"Bearer   {TOKEN}"], True),
    ([f"Bearer \t \t{TOKEN}"], True),
    # failures
    ([], False),
    ([""], False),
    (["Bearer"], False),
    (["Bearer "], False),
    (["Bearer    "], False),
    (["Bearer \t"], False),
    ([f"Bearer\t{TOKEN}"], False),  # the scheme ends at the first space
    ([f" Bearer {TOKEN}"], False),
    ([f"Basic {TOKEN}"], False),
    ([f"Basic {base64.b64encode(f'user:{TOKEN}'.encode()).decode()}"], False),
    ([f"Token {TOKEN}"], False),
    ([f"Bearer: {TOKEN}"], False),
    ([f"Bearer{TOKEN}"], False),
    ([TOKEN], False),
    ([f"Bearer {TOKEN} "], False),
    ([f"Bearer {TOKEN}\r\n"], False),
    ([f"Bearer {TOKEN}\r\nX-Evil: 1"], False),
    ([f"Bearer {TOKEN}x"], False),
    ([f"Bearer {TOKEN[:-1]}"], False),
    ([f"Bearer {TOKEN.upper()}"], False),
    ([f"Bearer {TOKEN},{TOKEN}"], False),
    (["Bearer wrong"], False),
    ([f"B\u0435arer {TOKEN}"], False),  # Cyrillic e
    ([f"Bearer\u00a0{TOKEN}"], False),  # no-break space is not a space
    ([f"Bearer {TOKEN}\x00"], False),
    ([f"Bearer {'A' * 1_000_000}"], False),
    # repeated Authorization headers are refused even when one is right
    ([f"Bearer {TOKEN}", f"Bearer {TOKEN}"], False),
    ([f"Bearer {TOKEN}", "Bearer wrong"], False),
    (["Bearer wrong", f"Bearer {TOKEN}"], False),
    (["Basic x", f"Bearer {TOKEN}"], False),
]


@pytest.mark.parametrize(("values", "ok"), AUTH_CASES)
def test_check_authorization(values: list[str], ok: bool) -> None:
    assert check_authorization(values, DIGEST) is ok
    assert BearerAuth.from_token(TOKEN).check(values) is ok


def test_token_with_inner_space_and_non_ascii_credentials() -> None:
    digest = token_digest("a b")
    assert check_authorization(["Bearer a b"], digest)
    assert not check_authorization(["Bearer a  b"], digest)
    # a latin-1 decoded credential never raises, it just fails
    assert not check_authorization(["Bearer t\u00f6k\udc80"], digest)


def test_comparison_is_constant_time_on_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert not check_authorization(["Bearer x"], DIGEST)
    assert check_authorization([f"Bearer {TOKEN}"], DIGEST)
    assert [len(a) for a, _ in seen] == [32, 32]
    assert all(b == DIGEST for _, b in seen)


def test_unauthorized_body_is_uniform() -> None:
    assert UNAUTHORIZED_BODY.encode() == b'{"error":"Unauthorized"}'


def test_bearer_auth_repr_hides_digest() -> None:
    assert "redacted" in repr(BearerAuth.from_token(TOKEN))
    assert DIGEST.hex() not in repr(BearerAuth.from_token(TOKEN))


# --------------------------------------------------------------------------- redaction


@pytest.mark.parametrize(
    ("text", "secrets", "expected"),
    [
        ("token=abc123", ["abc123"], f"token={REDACTED}"),
        ("abc123 and abc123", ["abc123"], f"{REDACTED} and {REDACTED}"),
        ("nothing here", ["abc123"], "nothing here"),
        ("abc123", [], "abc123"),
        ("abc123", [""], "abc123"),
        ("abc123456", ["abc123", "abc123456"], REDACTED),  # longest first, no tail left
        ("q=a%2Fb%3D", ["a/b="], f"q={REDACTED}"),  # percent-encoded form too
        ("Bearer a/b=", ["a/b="], f"Bearer {REDACTED}"),
        ("x" * 10 + "tok", ["tok"], "x" * 10 + REDACTED),
    ],
)
def test_redact(text: str, secrets: list[str], expected: str) -> None:
    assert redact(text, secrets) == expected


def _capture(secret: str) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter([secret]))
    logger = logging.getLogger(f"test.redact.{id(stream)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    return logger, stream


def test_redacting_filter_covers_message_args_and_tracebacks() -> None:
    logger, stream = _capture(TOKEN)
    logger.info("configured token %s for %s", TOKEN, "client")
    logger.warning(f"inline {TOKEN}")
    logger.info("plain %d", 3)
    try:
        raise ValueError(f"bad {TOKEN}")
    except ValueError:
        logger.exception("failed with %r", {"token": TOKEN})
    logger.info(f"bad format {TOKEN} %s %s", TOKEN)  # must not raise into the caller
    output = stream.getvalue()
    assert TOKEN not in output
    assert output.count(REDACTED) == 5
    assert "bad format [redacted] %s %s [log arguments dropped: format failed]" in output
    assert "configured token [redacted] for client" in output
    assert "plain 3" in output
    assert "ValueError: bad [redacted]" in output


def test_redacting_filter_with_no_secrets_is_transparent() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "a %s", ("b",), None)
    assert RedactingFilter([]).filter(record)
    assert record.args == ("b",)
