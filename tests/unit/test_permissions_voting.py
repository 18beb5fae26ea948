"""The multi-client permission voting state machine (spec §4.3, §7.6), table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from serve.errors.votes import vote_wire
from serve.permissions.voting import (
    CANCEL_SENTINEL,
    OUTCOME_ERROR,
    Cancelled,
    Forbidden,
    InvalidOption,
    MalformedOutcome,
    Mediator,
    NotPending,
    OpenRejected,
    PartialVote,
    PendingRequest,
    PermissionOption,
    Policy,
    Resolved,
    Selected,
    Vote,
    consensus_quorum,
    parse_vote_body,
)

OPTIONS = (
    PermissionOption("allow", "allow_once", "Allow"),
    PermissionOption("always", "allow_always", "Always"),
    PermissionOption("reject", "reject_once", "Reject"),
)
SESSION_CLIENTS = ("c-orig", "c-alice", "c-bob")

# voter label -> (client id, from loopback)
VOTERS: dict[str, tuple[str | None, bool]] = {
    "orig-local": ("c-orig", True),
    "alice-remote": ("c-alice", False),
    "anon-local": (None, True),
    "anon-remote": (None, False),
    "stranger-local": ("c-stranger", True),
}
OUTCOMES: dict[str, Selected | Cancelled] = {
    "allow": Selected("allow"),
    "bogus": Selected("nope"),
    "sentinel": Selected(CANCEL_SENTINEL),
    "cancel": Cancelled(),
}


def mk(
    policy: Policy = "first-responder",
    *,
    originator: str | None = "c-orig",
    clients: tuple[str, ...] = SESSION_CLIENTS,
    quorum: int | None = None,
    timeout_ms: int = 0,
    rid: str = "r1",
    session: str = "s1",
    now_ms: int = 1000,
) -> tuple[Mediator, PendingRequest]:
    med = Mediator(policy=policy, consensus_quorum=quorum, response_timeout_ms=timeout_ms)
    req = med.open(
        request_id=rid,
        session_id=session,
        options=OPTIONS,
        now_ms=now_ms,
        originator_client_id=originator,
        session_clients=clients,
    )
    assert isinstance(req, PendingRequest)
    return med, req


def vote(client: str | None, loopback: bool, outcome: Selected | Cancelled) -> Vote:
    return Vote(client_id=client, from_loopback=loopback, outcome=outcome)


# -- every policy x voter x outcome (one vote on a fresh request) ---------------------------

# the result of a valid "allow" vote, per policy configuration and voter
ALLOW_EXPECT: dict[str, dict[str, str]] = {
    "first-responder": {v: "resolved" for v in VOTERS},
    "designated": {
        "orig-local": "resolved",
        "alice-remote": "forbidden:designated_mismatch",
        "anon-local": "forbidden:designated_mismatch",
        "anon-remote": "forbidden:designated_mismatch",
        "stranger-local": "forbidden:designated_mismatch",
    },
    # designated with an anonymous prompt degrades to first-responder
    "designated-anonymous": {v: "resolved" for v in VOTERS},
    # 3 registered clients: quorum 2, so a single member vote is partial
    "consensus": {
        "orig-local": "partial",
        "alice-remote": "partial",
        "anon-local": "forbidden:designated_mismatch",
        "anon-remote": "forbidden:designated_mismatch",
        "stranger-local": "forbidden:designated_mismatch",
    },
    "local-only": {
        "orig-local": "resolved",
        "alice-remote": "forbidden:remote_not_allowed",
        "anon-local": "resolved",
        "anon-remote": "forbidden:remote_not_allowed",
        "stranger-local": "resolved",
    },
}


def expected(config: str, voter: str, outcome: str) -> str:
    if outcome == "cancel":
        return "cancelled"  # honoured under every policy, from anyone
    if outcome in ("bogus", "sentinel"):
        return "invalid"  # option validity is checked before the policy
    return ALLOW_EXPECT[config][voter]


def label(result: object) -> str:
    match result:
        case Resolved(outcome=Cancelled()):
            return "cancelled"
        case Resolved():
            return "resolved"
        case PartialVote():
            return "partial"
        case Forbidden(reason=reason):
            return f"forbidden:{reason}"
        case InvalidOption():
            return "invalid"
    return repr(result)


CASES = [
    (config, voter, outcome, expected(config, voter, outcome))
    for config in ALLOW_EXPECT
    for voter in VOTERS
    for outcome in OUTCOMES
]


@pytest.mark.parametrize(("config", "voter", "outcome", "want"), CASES)
def test_policy_voter_outcome_matrix(config: str, voter: str, outcome: str, want: str) -> None:
    policy: Policy = "designated" if config == "designated-anonymous" else config  # type: ignore[assignment]
    originator = None if config == "designated-anonymous" else "c-orig"
    med, req = mk(policy, originator=originator)
    client, loopback = VOTERS[voter]
    result = med.vote("r1", vote(client, loopback, OUTCOMES[outcome]), session_id="s1")
    assert label(result) == want
    still_pending = med.get("r1") is not None
    assert still_pending == (want not in ("resolved", "cancelled"))
    if want in ("resolved", "cancelled"):
        assert isinstance(result, Resolved)
        assert result.request == req
        assert [e.type for e in result.events] == ["permission_resolved"]
        assert result.voter_client_id == client


# -- events and agent responses --------------------------------------------------------------


def test_resolved_event_and_agent_response_for_selected_vote() -> None:
    med, _ = mk()
    v = Vote("c-alice", False, Selected("always"), meta={"note": "ok"})
    res = med.vote("r1", v, session_id="s1")
    assert isinstance(res, Resolved)
    (ev,) = res.events
    assert ev.type == "permission_resolved"
    assert ev.data == {
        "requestId": "r1",
        "outcome": {"outcome": "selected", "optionId": "always"},
        "voterClientId": "c-alice",
    }
    assert ev.originator_client_id == "c-alice"  # envelope origin = the voter
    assert res.reason is None
    assert res.voters == ("c-alice",)
    assert res.agent_response() == {
        "outcome": {"outcome": "selected", "optionId": "always"},
        "_meta": {"note": "ok"},
    }


def test_anonymous_vote_event_has_no_voter_client_id() -> None:
    med, _ = mk()
    res = med.vote("r1", vote(None, True, Selected("allow")))
    assert isinstance(res, Resolved)
    assert res.events[0].data == {
        "requestId": "r1",
        "outcome": {"outcome": "selected", "optionId": "allow"},
    }
    assert res.events[0].originator_client_id is None
    assert res.agent_response() == {"outcome": {"outcome": "selected", "optionId": "allow"}}


@pytest.mark.parametrize("policy", ["first-responder", "designated", "consensus", "local-only"])
def test_voter_cancel_resolves_without_cancel_reason_meta(policy: Policy) -> None:
    med, _ = mk(policy)
    res = med.vote("r1", vote("c-stranger", False, Cancelled()))
    assert isinstance(res, Resolved)
    assert res.reason == "voter"
    assert res.agent_response() == {"outcome": {"outcome": "cancelled"}}
    assert res.events[0].data == {
        "requestId": "r1",
        "outcome": {"outcome": "cancelled"},
        "voterClientId": "c-stranger",
    }


def test_forbidden_publishes_event_with_prompt_originator_as_origin() -> None:
    med, _ = mk("designated")
    res = med.vote("r1", vote("c-alice", True, Selected("allow")))
    assert isinstance(res, Forbidden)
    (ev,) = res.events
    assert ev.type == "permission_forbidden"
    assert ev.data == {
        "requestId": "r1",
        "sessionId": "s1",
        "clientId": "c-alice",
        "reason": "designated_mismatch",
    }
    assert ev.originator_client_id == "c-orig"
    anon = med.vote("r1", vote(None, False, Selected("allow")))
    assert isinstance(anon, Forbidden)
    assert "clientId" not in anon.events[0].data
    # the request is still pending and the designated client can still decide
    assert isinstance(med.vote("r1", vote("c-orig", False, Selected("reject"))), Resolved)


def test_local_only_remote_cancel_is_honoured_but_remote_select_is_not() -> None:
    med, _ = mk("local-only")
    res = med.vote("r1", vote("c-alice", False, Selected("allow")))
    assert isinstance(res, Forbidden) and res.reason == "remote_not_allowed"
    res2 = med.vote("r1", vote("c-alice", False, Cancelled()))
    assert isinstance(res2, Resolved) and isinstance(res2.outcome, Cancelled)


# -- late votes, wrong sessions, legacy route ------------------------------------------------


@pytest.mark.parametrize("policy", ["first-responder", "designated", "consensus", "local-only"])
def test_late_vote_is_already_resolved_with_event(policy: Policy) -> None:
    med, _ = mk(policy, clients=("c-orig",))  # consensus: quorum 1 of 1
    first = med.vote("r1", vote("c-orig", True, Selected("allow")))
    assert isinstance(first, Resolved)
    late = med.vote("r1", vote("c-alice", False, Selected("reject")), session_id="s1")
    assert isinstance(late, NotPending)
    assert late.reason == "already_resolved"
    (ev,) = late.events
    assert ev.type == "permission_already_resolved"
    assert ev.data == {
        "requestId": "r1",
        "sessionId": "s1",
        "outcome": {"outcome": "selected", "optionId": "allow"},
    }
    assert ev.originator_client_id == "c-alice"
    late_cancel = med.vote("r1", vote("c-orig", True, Cancelled()))
    assert isinstance(late_cancel, NotPending) and late_cancel.reason == "already_resolved"


def test_unknown_request_and_other_sessions_request_are_unknown() -> None:
    med, _ = mk()
    assert med.vote("nope", vote("c-orig", True, Selected("allow"))) == NotPending(
        "nope", None, "unknown"
    )
    other = med.vote("r1", vote("c-orig", True, Selected("allow")), session_id="s2")
    assert other == NotPending("r1", "s2", "unknown")
    assert med.get("r1") is not None  # untouched
    med.vote("r1", vote("c-orig", True, Selected("allow")), session_id="s1")
    # a late vote naming the wrong session does not learn the outcome
    assert med.vote("r1", vote("c-orig", True, Cancelled()), session_id="s2") == NotPending(
        "r1", "s2", "unknown"
    )


def test_legacy_route_without_session_resolves_and_session_of_finds_it() -> None:
    med, _ = mk()
    assert med.session_of("r1") == "s1"
    assert isinstance(med.vote("r1", vote("c-orig", True, Selected("allow"))), Resolved)
    assert med.session_of("r1") == "s1"  # remembered for late votes
    assert med.session_of("zzz") is None


def test_resolved_memory_is_a_bounded_lru() -> None:
    med = Mediator(resolved_memory=2, response_timeout_ms=0)
    for rid in ("a", "b", "c"):
        med.open(request_id=rid, session_id="s", options=OPTIONS, now_ms=0)
        med.vote(rid, vote(None, True, Selected("allow")))
    assert med.vote("a", vote(None, True, Cancelled())).reason == "unknown"  # type: ignore[union-attr]
    assert med.vote("b", vote(None, True, Cancelled())).reason == "already_resolved"  # type: ignore[union-attr]
    assert med.vote("c", vote(None, True, Cancelled())).reason == "already_resolved"  # type: ignore[union-attr]


def test_first_responder_second_vote_loses() -> None:
    med, _ = mk()
    assert isinstance(med.vote("r1", vote("c-alice", False, Selected("reject"))), Resolved)
    res = med.vote("r1", vote("c-orig", True, Selected("allow")))
    assert isinstance(res, NotPending)
    assert res.events[0].data["outcome"] == {"outcome": "selected", "optionId": "reject"}


# -- consensus -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("electorate", "configured", "quorum"),
    [
        (0, None, 1),
        (1, None, 1),
        (2, None, 2),  # unanimity for two
        (3, None, 2),
        (4, None, 3),
        (5, None, 3),
        (3, 1, 1),
        (3, 3, 3),
        (3, 5, 3),  # capped to |M|
        (0, 3, 1),  # capped to max(|M|, 1)
        (2, 2, 2),
    ],
)
def test_consensus_quorum_math(electorate: int, configured: int | None, quorum: int) -> None:
    assert consensus_quorum(electorate, configured) == quorum
    clients = tuple(f"c{i}" for i in range(electorate))
    _, req = mk("consensus", clients=clients, quorum=configured)
    assert req.quorum == quorum
    assert req.voters == frozenset(clients)


def test_consensus_sequence_partial_votes_then_quorum() -> None:
    med, _ = mk("consensus", clients=("a", "b", "c"))
    r1 = med.vote("r1", vote("a", False, Selected("allow")))
    assert isinstance(r1, PartialVote)
    assert (r1.votes_received, r1.votes_needed, r1.quorum) == (1, 1, 2)
    assert r1.option_tallies == {"allow": 1}
    (ev,) = r1.events
    assert ev.type == "permission_partial_vote"
    assert ev.data == {
        "requestId": "r1",
        "sessionId": "s1",
        "votesReceived": 1,
        "votesNeeded": 1,
        "quorum": 2,
        "optionTallies": {"allow": 1},
    }
    assert ev.originator_client_id == "a"
    r2 = med.vote("r1", vote("b", False, Selected("reject")))
    assert isinstance(r2, PartialVote)
    assert r2.option_tallies == {"allow": 1, "reject": 1}
    assert r2.votes_needed == 1 and r2.reachable
    r3 = med.vote("r1", vote("c", False, Selected("allow")))
    assert isinstance(r3, Resolved)
    assert r3.outcome == Selected("allow")
    assert r3.voters == ("a", "c")
    assert r3.voter_client_id == "c"


def test_consensus_repeat_vote_is_a_recorded_noop() -> None:
    med, _ = mk("consensus", clients=("a", "b", "c"))
    med.vote("r1", vote("a", False, Selected("allow")))
    again = med.vote("r1", vote("a", False, Selected("reject")))
    assert isinstance(again, PartialVote)
    assert again.duplicate and again.events == ()
    assert again.option_tallies == {"allow": 1}  # the first vote stands
    # "a" voting allow a second time does not reach quorum 2 alone
    assert isinstance(med.vote("r1", vote("a", False, Selected("allow"))), PartialVote)
    assert med.get("r1") is not None


def test_consensus_two_clients_is_unanimity_and_split_is_unreachable() -> None:
    med, _ = mk("consensus", clients=("a", "b"))
    assert isinstance(med.vote("r1", vote("a", True, Selected("allow"))), PartialVote)
    split = med.vote("r1", vote("b", True, Selected("reject")))
    assert isinstance(split, PartialVote)
    assert split.votes_needed == 1 and not split.reachable
    # only a cancel (or timeout) can end it now
    assert isinstance(med.vote("r1", vote("b", True, Cancelled())), Resolved)

    med2, _ = mk("consensus", clients=("a", "b"))
    med2.vote("r1", vote("a", True, Selected("allow")))
    assert med2.vote("r1", vote("b", True, Selected("allow"))).outcome == Selected("allow")  # type: ignore[union-attr]


def test_consensus_with_no_registered_clients_ends_only_by_cancel_or_timeout() -> None:
    med, req = mk("consensus", clients=(), timeout_ms=100)
    assert req.quorum == 1
    for client in ("c-orig", None):
        res = med.vote("r1", vote(client, True, Selected("allow")))
        assert isinstance(res, Forbidden) and res.reason == "designated_mismatch"
    (timed_out,) = med.expire(1100)
    assert timed_out.reason == "timeout"


def test_consensus_electorate_is_frozen_at_request_time() -> None:
    med, _ = mk("consensus", clients=("a",))
    late_joiner = med.vote("r1", vote("b", True, Selected("allow")))
    assert isinstance(late_joiner, Forbidden)
    assert isinstance(med.vote("r1", vote("a", True, Selected("allow"))), Resolved)


def test_consensus_configured_quorum_one_resolves_on_first_member_vote() -> None:
    med, _ = mk("consensus", clients=("a", "b", "c"), quorum=1)
    assert isinstance(med.vote("r1", vote("b", False, Selected("reject"))), Resolved)


# -- timeouts --------------------------------------------------------------------------------


def test_timeout_resolves_cancelled_exactly_at_deadline() -> None:
    med, req = mk(timeout_ms=5000, now_ms=1000)
    assert req.deadline_ms == 6000
    assert med.next_deadline_ms() == 6000
    assert med.expire(5999) == []
    (res,) = med.expire(6000)
    assert res.outcome == Cancelled() and res.reason == "timeout"
    assert res.voter_client_id is None
    assert res.events[0].data == {"requestId": "r1", "outcome": {"outcome": "cancelled"}}
    assert res.agent_response() == {
        "outcome": {"outcome": "cancelled"},
        "_meta": {"qwen.daemon.permissionCancelReason": "timeout"},
    }
    assert med.next_deadline_ms() is None
    late = med.vote("r1", vote("c-orig", True, Selected("allow")))
    assert isinstance(late, NotPending) and late.reason == "already_resolved"


def test_timeout_zero_waits_forever_and_per_request_override() -> None:
    med = Mediator(response_timeout_ms=0)
    a = med.open(request_id="a", session_id="s", options=OPTIONS, now_ms=0)
    med.open(request_id="b", session_id="s", options=OPTIONS, now_ms=0, timeout_ms=50)
    med.open(request_id="c", session_id="s", options=OPTIONS, now_ms=10, timeout_ms=20)
    assert isinstance(a, PendingRequest) and a.deadline_ms is None
    assert med.next_deadline_ms() == 30
    assert [r.request.request_id for r in med.expire(10**15)] == ["c", "b"]  # by deadline
    assert med.get("a") is not None


def test_default_timeout_is_five_minutes() -> None:
    med = Mediator()
    assert med.response_timeout_ms == 300_000
    req = med.open(request_id="a", session_id="s", options=OPTIONS, now_ms=7)
    assert isinstance(req, PendingRequest) and req.deadline_ms == 300_007


# -- cancel paths ----------------------------------------------------------------------------


def _three_requests() -> Mediator:
    med = Mediator(response_timeout_ms=0)
    med.open(request_id="a", session_id="s1", options=OPTIONS, now_ms=0, prompt_id="p1")
    med.open(request_id="b", session_id="s1", options=OPTIONS, now_ms=0, prompt_id="p2")
    med.open(request_id="c", session_id="s2", options=OPTIONS, now_ms=0, prompt_id="p3")
    return med


@pytest.mark.parametrize("reason", ["session_closed", "agent_cancelled", "daemon_shutdown"])
def test_cancel_session_resolves_only_that_sessions_requests(reason: Any) -> None:
    med = _three_requests()
    done = med.cancel_session("s1", reason)
    assert [r.request.request_id for r in done] == ["a", "b"]
    for r in done:
        assert r.outcome == Cancelled() and r.reason == reason
        assert r.agent_response()["_meta"] == {"qwen.daemon.permissionCancelReason": reason}
        assert r.events[0].type == "permission_resolved"
    assert med.pending_for("s1") == []
    assert [r.request_id for r in med.pending_for("s2")] == ["c"]
    assert med.cancel_session("s1") == []
    late = med.vote("a", vote(None, True, Selected("allow")), session_id="s1")
    assert isinstance(late, NotPending) and late.reason == "already_resolved"


def test_cancel_prompt_cancels_only_that_turn() -> None:
    med = _three_requests()
    (done,) = med.cancel_prompt("s1", "p2")
    assert done.request.request_id == "b" and done.reason == "turn_ended"
    assert [r.request_id for r in med.pending_for("s1")] == ["a"]


def test_cancel_all_and_cancel_one() -> None:
    med = _three_requests()
    one = med.cancel("b")
    assert one is not None and one.reason == "agent_cancelled"
    assert med.cancel("b") is None
    assert med.cancel("zzz") is None
    assert sorted(r.request.request_id for r in med.cancel_all()) == ["a", "c"]
    assert med.pending_count == 0
    assert med.snapshot() == {"pending": 0, "policy": "first-responder", "requests": []}


# -- opening and bounds ----------------------------------------------------------------------


def test_open_rejects_sentinel_option_and_bounds_pending() -> None:
    med = Mediator(max_pending_per_session=2, max_pending_total=3)
    bad = med.open(
        request_id="x",
        session_id="s",
        options=(PermissionOption(CANCEL_SENTINEL),),
        now_ms=0,
    )
    assert bad == OpenRejected("x", "s", "cancel_sentinel_collision")
    assert med.get("x") is None
    for rid in ("a", "b"):
        assert isinstance(
            med.open(request_id=rid, session_id="s", options=OPTIONS, now_ms=0), PendingRequest
        )
    assert med.open(request_id="c", session_id="s", options=OPTIONS, now_ms=0) == OpenRejected(
        "c", "s", "too_many_pending"
    )
    assert isinstance(
        med.open(request_id="d", session_id="t", options=OPTIONS, now_ms=0), PendingRequest
    )
    assert med.open(request_id="e", session_id="u", options=OPTIONS, now_ms=0) == OpenRejected(
        "e", "u", "capacity"
    )
    # resolving frees a slot
    med.vote("a", vote(None, True, Cancelled()))
    assert isinstance(
        med.open(request_id="f", session_id="s", options=OPTIONS, now_ms=0), PendingRequest
    )


def test_spec_default_limit_is_64_pending_per_session() -> None:
    med = Mediator()
    for i in range(64):
        med.open(request_id=f"r{i}", session_id="s", options=OPTIONS, now_ms=0)
    rejected = med.open(request_id="r64", session_id="s", options=OPTIONS, now_ms=0)
    assert isinstance(rejected, OpenRejected) and rejected.reason == "too_many_pending"


def test_caller_bugs_raise() -> None:
    med, _ = mk()
    with pytest.raises(ValueError, match="already in use"):
        med.open(request_id="r1", session_id="s1", options=OPTIONS, now_ms=0)
    with pytest.raises(ValueError, match="policy"):
        Mediator(policy="majority")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="quorum"):
        Mediator(consensus_quorum=0)
    with pytest.raises(ValueError, match="timeout"):
        Mediator(response_timeout_ms=-1)


def test_policy_is_frozen_into_each_request() -> None:
    med, req = mk("designated")
    assert req.policy == "designated" and req.designated_client_id == "c-orig"
    assert med.policy == "designated"
    _, fr = mk("first-responder")
    assert fr.voters == frozenset()  # the electorate only matters for consensus


def test_snapshot_lists_pending_requests() -> None:
    med, _ = mk("consensus", timeout_ms=10)
    med.vote("r1", vote("c-alice", False, Selected("allow")))
    assert med.snapshot() == {
        "pending": 1,
        "policy": "consensus",
        "requests": [
            {
                "requestId": "r1",
                "sessionId": "s1",
                "policy": "consensus",
                "createdAtMs": 1000,
                "deadlineMs": 1010,
                "votesReceived": 1,
                "quorum": 2,
            }
        ],
    }


# -- vote bodies and the wire ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ({"outcome": {"outcome": "cancelled"}}, (Cancelled(), None)),
        ({"outcome": {"outcome": "selected", "optionId": "allow"}}, (Selected("allow"), None)),
        (
            {"outcome": {"outcome": "selected", "optionId": "a"}, "_meta": {"k": 1}},
            (Selected("a"), {"k": 1}),
        ),
        ({"outcome": {"outcome": "selected", "optionId": "a"}, "other": 1}, (Selected("a"), None)),
        ({"outcome": {"outcome": "cancelled"}, "_meta": None}, (Cancelled(), None)),
        ({"outcome": {"outcome": "cancelled"}, "_meta": 5}, None),
        ({"outcome": {"outcome": "cancelled"}, "_meta": ["k"]}, None),
        ({"outcome": {"outcome": "selected", "optionId": ""}}, None),
        ({"outcome": {"outcome": "selected"}}, None),
        ({"outcome": {"outcome": "selected", "optionId": 3}}, None),
        ({"outcome": {"outcome": "maybe"}}, None),
        ({"outcome": "cancelled"}, None),
        ({}, None),
        ([], None),
        (None, None),
    ],
)
def test_parse_vote_body(body: object, want: object) -> None:
    got = parse_vote_body(body)
    if want is None:
        assert isinstance(got, MalformedOutcome)
    else:
        assert got == want


def test_a_vote_meta_that_is_not_an_object_is_named() -> None:
    got = parse_vote_body({"outcome": {"outcome": "cancelled"}, "_meta": 5})
    assert got == MalformedOutcome("`_meta` must be an object", "_meta")
    assert vote_wire(got) == (400, {"error": "`_meta` must be an object"})


def test_vote_body_checks_malformed_before_anything_else() -> None:
    med, _ = mk()
    assert isinstance(
        med.vote_body("unknown", {"outcome": 1}, client_id=None, from_loopback=True),
        MalformedOutcome,
    )
    res = med.vote_body(
        "r1",
        {"outcome": {"outcome": "selected", "optionId": "allow"}, "_meta": {"x": True}},
        client_id="c-orig",
        from_loopback=False,
        session_id="s1",
    )
    assert isinstance(res, Resolved) and res.meta == {"x": True}


@pytest.mark.parametrize(
    ("result", "legacy", "status", "body"),
    [
        (PartialVote("r", "s", 1, 1, 2, {"a": 1}), False, 200, {}),
        (
            NotPending("r", "s", "already_resolved"),
            False,
            404,
            {
                "error": "No pending permission request for session",
                "sessionId": "s",
                "requestId": "r",
            },
        ),
        (
            NotPending("r", "s", "unknown"),
            True,
            404,
            {"error": "No pending permission request", "requestId": "r"},
        ),
        (MalformedOutcome(), False, 400, {"error": OUTCOME_ERROR}),
    ],
)
def test_vote_wire_renders_each_result(
    result: Any, legacy: bool, status: int, body: dict[str, Any]
) -> None:
    assert vote_wire(result, legacy=legacy) == (status, body)


def test_vote_http_response_codes_for_invalid_and_forbidden() -> None:
    status, body = vote_wire(InvalidOption("r", "s", "zz"))
    assert status == 400
    assert {k: body[k] for k in ("code", "requestId", "optionId")} == {
        "code": "invalid_option_id",
        "requestId": "r",
        "optionId": "zz",
    }
    status, body = vote_wire(Forbidden("r", "s", "c", "remote_not_allowed"))
    assert status == 403
    assert {k: body[k] for k in ("code", "requestId", "sessionId", "reason")} == {
        "code": "permission_forbidden",
        "requestId": "r",
        "sessionId": "s",
        "reason": "remote_not_allowed",
    }
    med, _ = mk()
    assert vote_wire(med.vote("r1", vote(None, True, Cancelled())))[0] == 200
