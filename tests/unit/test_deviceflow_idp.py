"""IdP answer parsing and classification, PKCE, secrets, provider configuration (pure)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import msgspec
import pytest

from serve.deviceflow.idp import (
    IdpError,
    Secret,
    classify_token_response,
    new_pkce,
    parse_device_authorization,
)
from serve.deviceflow.machine import (
    PollFailed,
    SlowDown,
    TokenGranted,
    TokenPending,
    TokenRejected,
)
from serve.deviceflow.providers import (
    PROVIDERS_ENV,
    QWEN_OAUTH,
    ProviderConfigError,
    load_providers,
    provider_from_flag,
)

GOOD_DEVICE: dict[str, Any] = {
    "device_code": "DEV",
    "user_code": "USER-1",
    "verification_uri": "https://idp/device",
    "verification_uri_complete": "https://idp/device?user_code=USER-1",
    "expires_in": 600,
    "interval": 5,
}


def body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def test_device_authorization_is_parsed_and_the_device_code_kept_secret() -> None:
    parsed = parse_device_authorization(200, body(GOOD_DEVICE))
    assert parsed.public.user_code == "USER-1"
    assert parsed.public.verification_uri_complete == "https://idp/device?user_code=USER-1"
    assert (parsed.public.expires_in_s, parsed.public.interval_s) == (600.0, 5.0)
    assert parsed.device_code.reveal() == "DEV"
    assert "DEV" not in repr(parsed) and "DEV" not in str(parsed.device_code)


def test_device_authorization_accepts_google_style_url_and_missing_extras() -> None:
    doc = {k: v for k, v in GOOD_DEVICE.items() if k not in ("interval", "verification_uri")}
    doc.update(verification_url="https://idp/d", verification_uri_complete="javascript:x")
    parsed = parse_device_authorization(200, body(doc))
    assert parsed.public.verification_uri == "https://idp/d"
    assert parsed.public.verification_uri_complete is None
    assert parsed.public.interval_s is None


@pytest.mark.parametrize(
    ("status", "payload", "message"),
    [
        (400, body({"error": "invalid_client", "error_description": "who?"}), "invalid_client"),
        (500, b"<html>", "HTTP 500"),
        (200, b"[1]", "not a JSON object"),
        (200, body({**GOOD_DEVICE, "device_code": ""}), "device_code"),
        (200, body({**GOOD_DEVICE, "user_code": None}), "user_code"),
        (200, body({**GOOD_DEVICE, "verification_uri": "ftp://x"}), "verification_uri"),
        (200, body({**GOOD_DEVICE, "expires_in": "600"}), "expires_in"),
    ],
)
def test_bad_device_answers_are_upstream_errors(status: int, payload: bytes, message: str) -> None:
    with pytest.raises(IdpError, match=message):
        parse_device_authorization(status, payload)


@pytest.mark.parametrize(
    ("status", "payload", "outcome"),
    [
        (400, {"error": "authorization_pending"}, TokenPending()),
        (428, {"error": "authorization_pending"}, TokenPending()),
        (400, {"error": "slow_down"}, SlowDown()),
        (429, None, SlowDown()),
        (
            400,
            {"error": "expired_token"},
            TokenRejected("expired_token", "the IdP answered expired_token"),
        ),
        (
            400,
            {"error": "access_denied", "error_description": "user said no"},
            TokenRejected("access_denied", "the IdP answered access_denied: user said no"),
        ),
        (
            400,
            {"error": "invalid_grant"},
            TokenRejected("invalid_grant", "the IdP answered invalid_grant"),
        ),
        (
            401,
            {"error": "invalid_client"},
            TokenRejected("upstream_error", "the IdP answered invalid_client"),
        ),
        (200, {"error": "authorization_pending"}, TokenPending()),
        (
            200,
            {"token_type": "Bearer"},
            TokenRejected("upstream_error", "the token answer has no access_token"),
        ),
        (503, None, PollFailed("the token endpoint answered HTTP 503")),
        (404, None, TokenRejected("upstream_error", "the token endpoint answered HTTP 404")),
    ],
)
def test_token_answers_are_classified(
    status: int, payload: dict[str, Any] | None, outcome: object
) -> None:
    raw = body(payload) if payload is not None else b"oops"
    assert classify_token_response(status, raw) == (outcome, None)


def test_a_grant_returns_the_token_set() -> None:
    tokens = {"access_token": "AT", "refresh_token": "RT", "expires_in": 3600}
    outcome, got = classify_token_response(200, body(tokens))
    assert outcome == TokenGranted(3600.0)
    assert got == tokens


def test_long_descriptions_are_bounded() -> None:
    outcome, _ = classify_token_response(400, body({"error": "x", "error_description": "y" * 999}))
    assert isinstance(outcome, TokenRejected) and outcome.hint is not None
    assert len(outcome.hint) < 300


def test_secret_never_prints_or_encodes() -> None:
    secret = Secret("s3cr3t")
    assert str(secret) == repr(secret) == "[redacted]"
    assert f"{secret}" == "[redacted]"
    with pytest.raises(TypeError):
        msgspec.json.encode({"x": secret})
    assert secret.reveal() == "s3cr3t"


def test_pkce_challenge_is_s256_of_the_verifier() -> None:
    pkce = new_pkce()
    verifier = pkce.verifier.reveal()
    assert 43 <= len(verifier) <= 128
    digest = hashlib.sha256(verifier.encode()).digest()
    assert pkce.challenge == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert new_pkce().challenge != pkce.challenge


# ---- providers ----------------------------------------------------------------------------


def test_builtin_qwen_oauth_is_always_there() -> None:
    providers = load_providers(None, {})
    assert list(providers) == ["qwen-oauth"]
    assert providers["qwen-oauth"] == QWEN_OAUTH
    assert QWEN_OAUTH.pkce and QWEN_OAUTH.token_endpoint.startswith("https://chat.qwen.ai/")


def test_environment_providers() -> None:
    env = {
        PROVIDERS_ENV: json.dumps(
            {
                "corp": {
                    "deviceAuthorizationEndpoint": "http://127.0.0.1:1/device",
                    "tokenEndpoint": "http://127.0.0.1:1/token",
                    "clientId": "abc",
                    "scope": "openid",
                }
            }
        )
    }
    providers = load_providers(None, env)
    assert list(providers) == ["qwen-oauth", "corp"]
    corp = providers["corp"]
    assert (corp.client_id, corp.scope, corp.pkce) == ("abc", "openid", False)


def test_settings_mapping_and_flags() -> None:
    class Settings:
        device_flow_providers = (
            "corp=https://idp.example/oauth2/?client_id=abc&scope=openid+email&pkce=1",
        )

    providers = load_providers(Settings(), {})
    corp = providers["corp"]
    assert corp.device_authorization_endpoint == "https://idp.example/oauth2/device/code"
    assert corp.token_endpoint == "https://idp.example/oauth2/token"
    assert (corp.client_id, corp.scope, corp.pkce) == ("abc", "openid email", True)

    class Mapped:
        def __init__(self) -> None:
            self.device_flow_providers = {
                "m": {
                    "device_authorization_endpoint": "https://i/d",
                    "token_endpoint": "https://i/t",
                    "client_id": "x",
                }
            }

    assert load_providers(Mapped(), {})["m"].client_id == "x"


def test_config_file_section_as_structs_then_flags_win() -> None:
    class Entry:  # what a msgspec Struct of the config file looks like: snake_case attrs
        device_authorization_endpoint = "https://cfg/d"
        token_endpoint = "https://cfg/t"
        client_id = "from-config"
        scope = None
        pkce = True

    class Flags:
        device_flow_providers = ("corp=https://flag.example?client_id=from-flag",)

    providers = load_providers(None, {}, config_providers={"corp": Entry(), "other": Entry()})
    assert providers["corp"].client_id == "from-config" and providers["corp"].pkce
    providers = load_providers(Flags(), {}, config_providers={"corp": Entry()})
    assert providers["corp"].client_id == "from-flag"


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1]",
        json.dumps({"../x": {}}),
        json.dumps({"p": {"clientId": "a", "tokenEndpoint": "https://t"}}),
        json.dumps(
            {"p": {"deviceAuthorizationEndpoint": "https://d", "tokenEndpoint": "https://t"}}
        ),
        json.dumps(
            {
                "p": {
                    "deviceAuthorizationEndpoint": "file:///d",
                    "tokenEndpoint": "https://t",
                    "clientId": "a",
                }
            }
        ),
    ],
)
def test_bad_provider_configuration_is_refused(raw: str) -> None:
    with pytest.raises(ProviderConfigError):
        load_providers(None, {PROVIDERS_ENV: raw})


@pytest.mark.parametrize(
    "spec", ["corp", "corp=ftp://x?client_id=a", "corp=https://x", "=https://x?client_id=a"]
)
def test_bad_flags_are_refused(spec: str) -> None:
    with pytest.raises(ProviderConfigError):
        provider_from_flag(spec)
