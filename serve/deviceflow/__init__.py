"""OAuth 2.0 device authorization (RFC 8628) on behalf of remote clients.

* :mod:`serve.deviceflow.machine` — the flow table and its polling state machine (pure);
* :mod:`serve.deviceflow.providers` — provider configuration (built-in ``qwen-oauth``);
* :mod:`serve.deviceflow.idp` — the two IdP requests, response classification, ``Secret``;
* :mod:`serve.deviceflow.store` — credentials under the state directory (0600);
* :mod:`serve.deviceflow.poller` — the :class:`DeviceFlowPoller` actor;
* :mod:`serve.deviceflow.service` — registration under the root supervisor (imported by
  :mod:`serve.http.routes.auth`, not by this package).
"""

from serve.deviceflow.machine import FlowTable
from serve.deviceflow.poller import (
    DeviceFlowPoller,
    FlowNotFound,
    TooManyFlows,
    UnsupportedProvider,
    UpstreamError,
)
from serve.deviceflow.providers import QWEN_OAUTH, ProviderConfig, load_providers

__all__ = [
    "QWEN_OAUTH",
    "DeviceFlowPoller",
    "FlowNotFound",
    "FlowTable",
    "ProviderConfig",
    "TooManyFlows",
    "UnsupportedProvider",
    "UpstreamError",
    "load_providers",
]
