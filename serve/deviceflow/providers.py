"""Device-flow providers: the built-in ``qwen-oauth`` entry and configured ones.

Sources, later ones replacing earlier ones of the same name:

1. built in: ``qwen-oauth`` (chat.qwen.ai's public device endpoints, with PKCE);
2. the environment variable ``ACP_SERVE_DEVICE_FLOW_PROVIDERS``, a JSON object
   ``{name: {deviceAuthorizationEndpoint, tokenEndpoint, clientId, scope?, pkce?}}``;
3. the config file's ``deviceFlow.providers`` (``daemon.config.device_flow.providers``
   when the config Struct has that section): the same fields, as a dict or a Struct with
   snake_case attributes;
4. the daemon settings attribute ``device_flow_providers`` when present: either that same
   mapping or a sequence of ``NAME=URL`` strings (``--device-flow-provider``), where
   ``URL`` is an OAuth base laid out like
   qwen's (``URL/device/code``, ``URL/token``) carrying ``client_id``, optional
   ``scope`` and ``pkce=1`` as query parameters, e.g.
   ``corp=https://idp.example/oauth2?client_id=abc&scope=openid``.

Names are ``[A-Za-z0-9_.-]{1,64}`` (they name the credentials file); endpoints must be
http(s) URLs. A bad entry raises :class:`ProviderConfigError` naming it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Final
from urllib.parse import parse_qs, urlsplit, urlunsplit

import msgspec

PROVIDERS_ENV: Final = "ACP_SERVE_DEVICE_FLOW_PROVIDERS"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ProviderConfigError(ValueError):
    """A configured device-flow provider is malformed (the message names it)."""


_HTTP_URL = Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s/]+")]
_NAME_KEY = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class ProviderEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """One ``deviceFlow.providers.NAME`` entry of the daemon config file."""

    device_authorization_endpoint: _HTTP_URL
    token_endpoint: _HTTP_URL
    client_id: Annotated[str, msgspec.Meta(min_length=1)]
    scope: str | None = None
    pkce: bool = False


class DeviceFlowSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The config file's ``deviceFlow:`` section (absent: no configured providers)."""

    providers: dict[_NAME_KEY, ProviderEntry] = {}


class ProviderConfig(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    device_authorization_endpoint: str
    token_endpoint: str
    client_id: str
    scope: str | None = None
    pkce: bool = False


QWEN_OAUTH: Final = ProviderConfig(
    id="qwen-oauth",
    device_authorization_endpoint="https://chat.qwen.ai/api/v1/oauth2/device/code",
    token_endpoint="https://chat.qwen.ai/api/v1/oauth2/token",
    client_id="f0304373b74a44d2b584a3fb70ca9e56",
    scope="openid profile email model.completion",
    pkce=True,
)


def _url(name: str, field: str, value: object) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ProviderConfigError(f"device-flow provider {name!r}: {field} must be an http(s) URL")
    return value


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProviderConfigError(
            f"device-flow provider name {name!r} must match [A-Za-z0-9_.-]{{1,64}}"
        )
    return name


def _field(raw: object, *names: str) -> object:
    """Read a field by its camelCase or snake_case name, from a mapping or an object."""
    for name in names:
        if isinstance(raw, Mapping):
            if name in raw:
                return raw[name]
        elif hasattr(raw, name):
            return getattr(raw, name)
    return None


def provider_from_mapping(name: object, raw: object) -> ProviderConfig:
    name = _check_name(name)
    client_id = _field(raw, "clientId", "client_id")
    if not isinstance(client_id, str) or not client_id:
        raise ProviderConfigError(f"device-flow provider {name!r}: clientId is required")
    scope = _field(raw, "scope")
    if scope is not None and not isinstance(scope, str):
        raise ProviderConfigError(f"device-flow provider {name!r}: scope must be a string")
    pkce = _field(raw, "pkce")
    return ProviderConfig(
        id=name,
        device_authorization_endpoint=_url(
            name,
            "deviceAuthorizationEndpoint",
            _field(raw, "deviceAuthorizationEndpoint", "device_authorization_endpoint"),
        ),
        token_endpoint=_url(name, "tokenEndpoint", _field(raw, "tokenEndpoint", "token_endpoint")),
        client_id=client_id,
        scope=scope,
        pkce=bool(pkce),
    )


def provider_from_flag(spec: str) -> ProviderConfig:
    """``NAME=URL`` (see the module docstring)."""
    name, sep, url = spec.partition("=")
    if not sep:
        raise ProviderConfigError(f"--device-flow-provider {spec!r}: expected NAME=URL")
    name = _check_name(name.strip())
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ProviderConfigError(f"--device-flow-provider {name!r}: URL must be http(s)")
    query = parse_qs(parts.query)
    client_ids = query.get("client_id")
    if not client_ids or not client_ids[0]:
        raise ProviderConfigError(f"--device-flow-provider {name!r}: URL needs ?client_id=")
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    scopes = query.get("scope")
    return ProviderConfig(
        id=name,
        device_authorization_endpoint=f"{base}/device/code",
        token_endpoint=f"{base}/token",
        client_id=client_ids[0],
        scope=scopes[0] if scopes else None,
        pkce=query.get("pkce", ["0"])[0] in ("1", "true"),
    )


def parse_providers_json(text: str) -> dict[str, ProviderConfig]:
    try:
        doc = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise ProviderConfigError(f"{PROVIDERS_ENV} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProviderConfigError(f"{PROVIDERS_ENV} must be a JSON object")
    return {name: provider_from_mapping(name, raw) for name, raw in doc.items()}


def _apply(providers: dict[str, ProviderConfig], configured: object) -> None:
    if isinstance(configured, Mapping):
        for name, raw in configured.items():
            providers[_check_name(name)] = provider_from_mapping(name, raw)
    elif isinstance(configured, list | tuple):
        for item in configured:
            if isinstance(item, str):
                provider = provider_from_flag(item)
                providers[provider.id] = provider
            elif isinstance(item, ProviderConfig):
                providers[item.id] = item


def load_providers(
    settings: object = None,
    environ: Mapping[str, str] | None = None,
    *,
    config_providers: object = None,
) -> dict[str, ProviderConfig]:
    """Built-in, then the environment, then ``config_providers`` (the config file's
    ``deviceFlow.providers``: a mapping of name → fields, as Structs or dicts), then
    ``settings.device_flow_providers`` (flags). Raises :class:`ProviderConfigError`."""
    environ = os.environ if environ is None else environ
    providers: dict[str, ProviderConfig] = {QWEN_OAUTH.id: QWEN_OAUTH}
    raw_env = environ.get(PROVIDERS_ENV, "").strip()
    if raw_env:
        providers.update(parse_providers_json(raw_env))
    _apply(providers, config_providers)
    _apply(providers, getattr(settings, "device_flow_providers", None))
    return providers
