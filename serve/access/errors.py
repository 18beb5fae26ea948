"""The access refusals, without statuses (``serve.errors`` maps them: 403 and 429)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AccessError",
    "Forbidden",
    "PrincipalBudgetExhausted",
    "QuotaExceeded",
    "WorkspaceDenied",
]


class AccessError(Exception):
    def __init__(self, message: str, code: str, **fields: object) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.fields = fields

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, **self.fields}


class Forbidden(AccessError):
    """A known session (or a daemon-wide operation) without the role it needs."""

    def __init__(self, need: str, **fields: object) -> None:
        super().__init__(f"This needs the role {need}", "forbidden", need=need, **fields)
        self.need = need


class QuotaExceeded(AccessError):
    """A principal's quota is spent (429 with ``Retry-After``)."""

    def __init__(self, quota: str, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"Quota exceeded: {quota} (limit {limit})",
            "quota_exceeded",
            quota=quota,
            limit=limit,
            retryAfterMs=retry_after_s * 1000,
        )
        self.retry_after_s = retry_after_s


class PrincipalBudgetExhausted(AccessError):
    """The principal's live sessions spent its token or cost budget (402)."""

    def __init__(self, principal: str, dimension: str, spent: float, limit: float) -> None:
        super().__init__(
            f"Your {dimension} budget across your sessions is exhausted ({spent:g} of {limit:g})",
            "budget_exhausted",
            scope="principal",
            principal=principal,
            dimension=dimension,
            spent=spent,
            limit=limit,
        )


class WorkspaceDenied(AccessError):
    """A workspace the principal may not use: answered as if it were not served (404)."""

    def __init__(self, workspace: str) -> None:
        super().__init__(
            f'No workspace "{workspace}" is served by this daemon',
            "workspace_not_found",
            workspace=workspace,
        )
