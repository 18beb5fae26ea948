"""The application layer: the session use cases once, under both fronts, without a transport.

Design
------
REST (``serve/http/routes/sessions.py``) and ``/acp`` (``serve/acpfront/``) are translators:
parse the request, call the service, render the answer. Between them and the actors sits
this package (as httpx's one ``BaseClient`` under ``Client`` and ``AsyncClient``):

* :mod:`.prompts` (sans-IO) — a prompt body validated in one place (:func:`parse_prompt`:
  content blocks, the ``_meta`` forwarded to the agent, ``steer``, ``promptId``,
  ``deadlineMs`` bounds) into a frozen :class:`PromptBody`; a finished turn read into a
  :class:`TurnCompleted` or raised as a ``TurnFailed`` whose class says if a retry may work.
* :mod:`.sessions` — :class:`SessionService` over what it needs of the Host
  (:class:`SessionHost`): find and ask a session, check a client, resolve the workspace,
  open / create / restore a session (the "agent failed to start" refusal, the restore the
  agent does not know → ``SessionNotFound``), apply the approval mode and model asked at
  creation, submit a prompt and await its outcome, list, vote, the draining check.

Results are frozen dataclasses (:class:`Opened`, :class:`Created`, :class:`Submitted`,
:class:`Vote`, :class:`TurnCompleted`) or the sessions' own typed replies
(``serve.sessions.messages``); failures are the domain's errors (``serve.sessions.errors``),
and only the table in :mod:`serve.errors` gives them a status, a body and headers.

Dependency position: it imports the domain packages and ``serve.errors``, never
``serve.http``, ``serve.acpfront``, ``serve.host`` or a web framework; the fronts import it
(``tests/test_architecture.py``).

The ``/acp`` front, method by method (``serve/acpfront/front.py`` today → the service)
--------------------------------------------------------------------------------------
========================================  ==================================================
``/acp``                                  service call replacing its copy
========================================  ==================================================
``session/new`` (``_ticket_session``)     ``check_accepting()``; ``open_new(ws, scope, dirs)``
  approval mode / model after create      ``apply_settings(session, client, mode, model)``
``session/load`` / ``session/resume``     ``open_restored(sid, ws, action, dirs)`` (its
  (500 → 404 by JSON-RPC code)            -32002 / -32602 → ``SessionNotFound``)
``session/list``                          ``summaries(workspace)`` (the front adds its
                                          ``cwd``/``title``/``updatedAt`` aliases)
``session/prompt`` (``_validate_prompt``,  ``parse_prompt(params, steering=False)``; ``submit``;
  promptId / deadlineMs, retryable map)   ``outcome(...)`` → ``TurnCompleted`` / ``TurnFailed``
``_session/steering``                     ``prompts.prompt_content(params["prompt"])``,
                                          ``prompts.forwarded(params)``
``session/permission``, a client's reply  ``vote(request_id, sid, body, client, loopback)``
  to a forwarded permission request
``session/cancel``, ``close``,            ``ask(session, Msg, ReplyType)`` (a gone session:
``set_mode``, ``set_model``, heartbeat,   ``SessionNotFound``)
``update_metadata``, ``Describe``
``_rpc_from_exception`` (its own mapper)  the table: ``serve.errors.wire_error`` (+ the
                                          JSON-RPC renderer) for every error above
========================================  ==================================================

Where the copies drifted, and what the service does
---------------------------------------------------
1. ``deadlineMs``: REST bounds it (``0 < d <= 2**31 - 1``) and answers
   ``invalid_prompt_id`` / ``invalid_deadline_ms``; ``/acp`` has no upper bound and no code
   (-32602 without data). Service: REST's (:data:`~.prompts.MAX_DEADLINE_MS`, the codes).
   Done: ``/acp`` ``session/prompt`` calls :func:`~.prompts.parse_prompt` (the codes ride in
   the error's ``data``, ``tests/acpfront/test_wire.py``), ``_session/steering``
   :func:`~.prompts.prompt_content`.
2. The order of the prompt checks: REST content, ``_meta``, ``steer``, ``promptId``,
   ``deadlineMs``; ``/acp`` content, ``promptId``, ``deadlineMs``, ``_meta``. Service: REST's
   (both fronts now).
3. Extra keys forwarded to the agent: both fronts now use ``turns.passthrough`` (``_meta``
   only), so a body's ``sessionId`` is never forwarded. Service: :func:`~.prompts.forwarded`,
   the one allow-list.
4. "Agent failed to start": REST keeps a failure the table knows in its form (an agent's
   ``RemoteError`` is a 500 with its code, which a restore re-maps to 404 when it is -32002 /
   -32602) and answers anything else ``503 acp_channel_unavailable`` with ``Retry-After: 5``;
   ``/acp`` turns every 500 without a status into that 503, the ``RemoteError`` included, so
   its 404 re-mapping never fires. Service: REST's (``AgentStartFailed``, ``SessionNotFound``).
5. A failed turn: REST 402 (budget), 503 + ``Retry-After`` (``agent_unavailable`` 1 s,
   ``memory_budget_exceeded`` 10 s), 404 (``agent_session_not_found``), 503 (retryable),
   500; ``/acp`` 402 / 503 / 500 (``agent_session_not_found`` is a 500 there). Service:
   REST's, as the ``TurnFailed`` classes of ``serve.sessions.errors`` and the table.
6. Settings after create: REST swallows only a domain refusal (a ``SessionError``, a gone
   session) and lets an ask timeout through; ``/acp`` swallows any exception. REST also
   validates ``approvalMode`` against ``APPROVAL_MODES`` and gates it on a configured token
   before creating; ``/acp`` applies any non-empty string. Service: ``apply_settings``
   swallows ``SessionError`` (REST); the validation and the 401 gate stay REST's parsing.
7. The registry stopped: REST ``503 daemon_draining`` ("Daemon is shutting down"); ``/acp``
   a ``session_not_found`` for an empty id. Service: REST's. Draining itself is one check,
   ``check_accepting`` (the registry's ``daemon_draining`` refusal, raised as soon as the
   Host drains: the registry stops accepting only when the drain ends).
8. A full prompt queue: REST ``503 {error, code, sessionId, limit, pendingCount}`` with
   ``Retry-After: 5``; ``/acp`` ``data {httpStatus, code, limit}``. Service: REST's
   (``PromptQueueRefused``).
9. Workspaces: REST resolves ``cwd`` only (``workspace_mismatch`` with ``boundWorkspace``,
   ``requestedWorkspace``, ``workspaceCount``); ``/acp`` also ``workspaceCwd`` and a
   workspace id, defaults to the connection's, and answers only ``requestedWorkspace``.
   Service: REST's as :meth:`SessionService.workspace`; ``/acp``'s connection default stays
   the front's.
"""

from serve.api.prompts import (
    PromptBody,
    PromptContent,
    TurnCompleted,
    forwarded,
    parse_prompt,
    prompt_content,
    turn_outcome,
)
from serve.api.sessions import (
    ASK_TIMEOUT_S,
    Created,
    Opened,
    SessionHost,
    SessionService,
    Submitted,
    Vote,
)

__all__ = [
    "ASK_TIMEOUT_S",
    "Created",
    "Opened",
    "PromptBody",
    "PromptContent",
    "SessionHost",
    "SessionService",
    "Submitted",
    "TurnCompleted",
    "Vote",
    "forwarded",
    "parse_prompt",
    "prompt_content",
    "turn_outcome",
]
