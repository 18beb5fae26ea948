"""``POST /daemon/bind``: late binding of a warm daemon to its tenant (``--bootstrap-token``).

The body is :class:`serve.tenant_claim.BindRequest`::

    {"token": "<the tenant's token>",
     "workspace": {"path": "/workspace"} | {"repository": "https://...", "ref": "main"},
     "agentEnv": {"OPENAI_API_KEY": "..."},
     "credentials": [{"path": ".qwen/oauth_creds.json", "content": "..."}]}

Only a daemon started with ``--bootstrap-token`` (and still unbound) binds; the security
front lets only the bootstrap token through, and nothing but this route and the probes
before the bind. Answers:

* ``200 {"bound": true, "workspace", "cloned", "agentEnv": [names], "credentials": [paths]}``:
  the tenant's token is installed (``Authorization: Bearer`` or ``--token-header``), the
  bootstrap token is revoked, the agent pools start their warm children with the
  variables;
* ``400 invalid_bind`` (``field`` names the member) or ``400`` invalid JSON: nothing changed;
* ``422 bind_failed``: the clone or a write failed; nothing of it was kept, the daemon is
  still unbound and the bind may be retried;
* ``409 already_bound`` (bound before), ``409 bind_in_progress`` (another bind is running),
  ``409 not_late_bound`` (a daemon started with its own token).

The variables' values and the token are added to the log redaction.
"""

from __future__ import annotations

import logging
import os
import time

import msgspec
from quart import Blueprint, Response

from serve import threads
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request, invalid_json
from serve.http.security import redact
from serve.http.wire import body_bytes, json_response
from serve.logs import install_redaction
from serve.tenant_claim import BindFailed, BindRefused, BindRequest, apply_files, plan_bind

log = logging.getLogger(__name__)

blueprint = Blueprint("bind", __name__)

FEATURES: tuple[Feature, ...] = (
    Feature(
        "daemon_late_bind",
        (("POST", "/daemon/bind"),),
        when=lambda h: h.binding is not None and h.binding.late,
    ),
)

_NO_STORE = {"Cache-Control": "no-store"}


def _conflict(message: str, code: str) -> ApiError:
    return ApiError(409, {"error": message, "code": code})


@blueprint.post("/daemon/bind")
async def post_bind() -> Response:
    d = daemon()
    binding = d.binding
    if binding is None or not binding.late:
        raise _conflict(
            "This daemon was started with its own token (no --bootstrap-token): nothing to bind",
            "not_late_bound",
        )
    if not binding.pending:
        raise _conflict("This daemon is already bound", "already_bound")
    data = await body_bytes()
    if not data.strip():
        raise invalid_json()
    try:
        req = msgspec.json.decode(data, type=BindRequest)
    except msgspec.ValidationError as exc:
        raise bad_request(f"Invalid bind: {exc}", "invalid_bind") from None
    except msgspec.DecodeError:
        raise invalid_json() from None
    if not binding.begin():
        if not binding.pending:
            raise _conflict("This daemon is already bound", "already_bound")
        raise _conflict("Another bind is running", "bind_in_progress")
    settings = d.settings
    try:
        plan = await threads.run_sync(
            threads.file_routes_limiter(),
            lambda: plan_bind(req, workspaces=settings.workspaces, home=os.environ.get("HOME")),
        )
        await apply_files(plan)
        for rt in d.registry:
            await rt.agents.install_env(plan.agent_env)
    except BindRefused as exc:
        binding.abort()
        raise bad_request(str(exc), "invalid_bind", field=exc.field) from None
    except BindFailed as exc:
        binding.abort()
        message = redact(str(exc), [req.token, *req.agent_env.values()])
        log.warning("bind failed: %s", message)
        raise ApiError(422, {"error": message, "code": "bind_failed"}) from None
    except BaseException:
        binding.abort()
        raise
    binding.complete(plan, time.time())
    install_redaction([settings.token, *plan.secrets])
    log.info(
        "bound: workspace %s%s, %d agent variables, %d credential files; bootstrap token revoked",
        plan.workspace,
        " (cloned)" if plan.repository is not None else "",
        len(plan.agent_env),
        len(plan.credentials),
    )
    return json_response(plan.summary(), headers=_NO_STORE)
