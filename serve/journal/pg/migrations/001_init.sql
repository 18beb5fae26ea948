-- The PostgreSQL journal, version 1: sessions' meta, their events, and fenced leases.
-- docs/postgres-journal.md explains every table; applied once, in one transaction, under
-- the migration advisory lock (serve/journal/pg/schema.py).

-- Lease epochs come from one sequence, so an epoch only ever grows, for every session, even
-- when a session's rows are deleted and the same id is journaled again.
CREATE SEQUENCE lease_epoch_seq AS bigint;

-- One owner per session at a time. A daemon writes a session only while it holds the
-- session's lease at the epoch it acquired; a new acquisition takes a new (larger) epoch.
CREATE TABLE session_leases (
    session_id    text PRIMARY KEY,
    owner_id      text NOT NULL,            -- the daemon (its <state_dir>/daemon-id)
    epoch         bigint NOT NULL,          -- from lease_epoch_seq: only grows
    expires_at    timestamptz NOT NULL,     -- renewed by the owner; past it, free to take
    owner_address text NOT NULL DEFAULT '', -- how to reach the owner (http://host:port)
    acquired_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per journaled session: what meta.json holds in the files journal.
CREATE TABLE journal_sessions (
    session_id    text PRIMARY KEY,
    meta          jsonb NOT NULL,           -- JournalMeta (owner records, budgets... in attrs)
    created_at_ms bigint NOT NULL,
    clean_last_id bigint,                   -- set by a clean close; NULL while open / crashed
    next_id       bigint,                   -- the id the next event must carry (NULL: empty)
    event_count   bigint NOT NULL DEFAULT 0,
    total_bytes   bigint NOT NULL DEFAULT 0, -- type + frame bytes of the events kept
    updated_at    timestamptz NOT NULL DEFAULT now(),
    lease_epoch   bigint NOT NULL           -- the epoch of the write that made this version
);

-- The events: one gap-free run of ids per session (batches are transactions).
CREATE TABLE journal_events (
    session_id  text NOT NULL REFERENCES journal_sessions (session_id) ON DELETE CASCADE,
    event_id    bigint NOT NULL,
    event_type  text NOT NULL,
    frame       bytea NOT NULL,
    lease_epoch bigint NOT NULL,
    PRIMARY KEY (session_id, event_id)
);

CREATE INDEX journal_sessions_updated ON journal_sessions (updated_at);

-- The fence: a write carries the writer's lease epoch and is refused (SQLSTATE AS001)
-- unless it is the session's current one. The lease rows are read FOR SHARE: a concurrent
-- takeover (an UPDATE of the lease) waits for this transaction, and this check sees a
-- takeover that committed first. Sessions: per row. Events: once per statement (a batch's
-- run is one INSERT), over its transition table.
CREATE FUNCTION journal_sessions_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    current_epoch bigint;
BEGIN
    SELECT epoch INTO current_epoch FROM session_leases
        WHERE session_id = NEW.session_id FOR SHARE;
    IF current_epoch IS DISTINCT FROM NEW.lease_epoch THEN
        RAISE EXCEPTION 'session %: lease epoch % is stale (current %)',
            NEW.session_id, NEW.lease_epoch, current_epoch
            USING ERRCODE = 'AS001';
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION journal_events_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    PERFORM 1 FROM session_leases l
        WHERE l.session_id IN (SELECT n.session_id FROM new_rows n)
        ORDER BY l.session_id FOR SHARE OF l;
    SELECT n.session_id, n.lease_epoch, l.epoch AS current_epoch INTO bad
        FROM new_rows n LEFT JOIN session_leases l ON l.session_id = n.session_id
        WHERE l.epoch IS DISTINCT FROM n.lease_epoch LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'session %: lease epoch % is stale (current %)',
            bad.session_id, bad.lease_epoch, bad.current_epoch
            USING ERRCODE = 'AS001';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER journal_sessions_fence BEFORE INSERT OR UPDATE ON journal_sessions
    FOR EACH ROW EXECUTE FUNCTION journal_sessions_fence();
CREATE TRIGGER journal_events_fence_insert AFTER INSERT ON journal_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION journal_events_fence();
CREATE TRIGGER journal_events_fence_update AFTER UPDATE ON journal_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION journal_events_fence();
