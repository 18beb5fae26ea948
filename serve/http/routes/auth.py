"""Device-flow routes (spec §4.7) and ``GET /workspace/auth/status``.

``POST /workspace/auth/device-flow`` (strict) starts or attaches to the provider's flow:
``201`` new, ``200`` attached; the user code and verification URIs are in the body only
for the initiating client (same ``X-Qwen-Client-Id``, or both anonymous).
``GET``/``DELETE /workspace/auth/device-flow/<flow_id>`` (strict) read and cancel;
``GET /workspace/auth/status`` lists pending flows and supported providers.

Errors are mapped here, in one place: ``400 invalid_request`` (body),
``400 unsupported_provider`` (+ ``supportedProviders``), ``409 too_many_active_flows``,
``502 upstream_error``, ``404 device_flow_not_found``, ``503 device_flow_unavailable``
when the poller actor is not running.
"""

from __future__ import annotations

from quart import Blueprint, Response

from actors import ActorError
from serve.deviceflow import (
    DeviceFlowPoller,
    FlowNotFound,
    TooManyFlows,
    UnsupportedProvider,
    UpstreamError,
)
from serve.http.addressing import check_workspace_client
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, service_unavailable
from serve.http.routes.sessions import header_client_id
from serve.http.wire import json_body, json_response

blueprint = Blueprint("auth", __name__)

FLOWS_RULE = "/workspace/auth/device-flow"
FLOW_RULE = "/workspace/auth/device-flow/<flow_id>"
STATUS_RULE = "/workspace/auth/status"

FEATURES: tuple[Feature, ...] = (
    Feature(
        "auth_device_flow",
        (("POST", FLOWS_RULE), ("GET", FLOW_RULE), ("DELETE", FLOW_RULE), ("GET", STATUS_RULE)),
    ),
)


def _unavailable() -> ApiError:
    return service_unavailable("The device-flow poller is not running", "device_flow_unavailable")


def _poller() -> DeviceFlowPoller:
    poller = daemon().device_flow
    if poller.closed:
        raise _unavailable()
    return poller


def _client_id() -> str | None:
    return check_workspace_client(daemon(), header_client_id())


def _not_found(flow_id: str) -> ApiError:
    return ApiError(
        404,
        {
            "error": f'No device flow with id "{flow_id}"',
            "code": "device_flow_not_found",
            "deviceFlowId": flow_id,
        },
    )


@blueprint.post(FLOWS_RULE)
async def start_device_flow() -> Response:
    body = await json_body(allow_empty=False)
    provider_id = body.get("providerId")
    if not isinstance(provider_id, str) or not provider_id.strip():
        raise ApiError(
            400, {"error": "`providerId` must be a non-empty string", "code": "invalid_request"}
        )
    client_id = _client_id()
    poller = _poller()
    try:
        flow_id, attached = await poller.start_flow(provider_id, client_id)
        view = poller.view(flow_id, client_id, attached=attached)
    except UnsupportedProvider as exc:
        raise ApiError(
            400,
            {
                "error": str(exc),
                "code": "unsupported_provider",
                "providerId": provider_id,
                "supportedProviders": exc.supported,
            },
        ) from None
    except TooManyFlows as exc:
        raise ApiError(
            409, {"error": str(exc), "code": "too_many_active_flows", "limit": exc.limit}
        ) from None
    except UpstreamError as exc:
        raise ApiError(
            502, {"error": f"Device authorization failed: {exc}", "code": "upstream_error"}
        ) from None
    except FlowNotFound as exc:  # evicted between start and view: only under a crash
        raise _not_found(exc.flow_id) from None
    except ActorError:
        raise _unavailable() from None
    return json_response(view, 200 if attached else 201)


@blueprint.get(FLOW_RULE)
async def get_device_flow(flow_id: str) -> Response:
    client_id = _client_id()
    try:
        return json_response(_poller().view(flow_id, client_id))
    except FlowNotFound:
        raise _not_found(flow_id) from None


@blueprint.delete(FLOW_RULE)
async def cancel_device_flow(flow_id: str) -> Response:
    _client_id()
    try:
        await _poller().cancel_flow(flow_id)
    except FlowNotFound:
        raise _not_found(flow_id) from None
    except ActorError:
        raise _unavailable() from None
    return Response(b"", status=204)


@blueprint.get(STATUS_RULE)
async def auth_status() -> Response:
    _client_id()
    d = daemon()
    poller = _poller()
    return json_response(
        {
            "v": 1,
            "workspaceCwd": d.settings.primary_workspace,
            "providers": [],
            "pendingDeviceFlows": poller.pending_flows(),
            "supportedDeviceFlowProviders": poller.supported,
        }
    )
