-- Version 2: a daemon's liveness, so a dead owner's sessions can be taken before their
-- leases expire (docs/postgres-journal.md, "Owners and takeover").
--
-- A live daemon holds a session-level advisory lock on a connection of its own, keyed
-- (class 0x61636C76 "aclv", hashtext(owner_id)); when its process dies the kernel closes the
-- socket, PostgreSQL ends that backend and the lock goes with it. A frozen daemon keeps its
-- connection (and the lock): its leases are taken only once they expire.

CREATE FUNCTION journal_owner_alive(owner text) RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory'
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND classid = 1633905782::bigint::oid
          AND objid = (hashtext(owner)::bigint & 4294967295)::oid
          AND objsubid = 2
          AND granted)
$$;
