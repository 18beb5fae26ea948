"""The PostgreSQL journal's schema: plain SQL migrations kept beside this module.

``migrations/NNN_name.sql`` are applied in order, each once, at start
(:func:`migrate`): all pending ones in one transaction, under a transaction-scoped advisory
lock (:data:`MIGRATION_LOCK`), so daemons starting together on one database apply them
once and the others wait and then find them done. ``schema_version`` records what was
applied. Blocking: called in a worker thread.
"""

from __future__ import annotations

import re
from importlib import resources

import psycopg

#: pg_advisory_xact_lock key of the journal's migrations ("acpj" in ASCII).
MIGRATION_LOCK = 0x61636A70
_NAME = re.compile(r"(\d{3})_[a-z0-9_]+\.sql")


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every migration in the package, in order."""
    found: list[tuple[int, str, str]] = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _NAME.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort()
    return found


def migrate(conn: psycopg.Connection[tuple[object, ...]]) -> list[int]:
    """Apply the pending migrations in one transaction; the versions applied."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        rows = conn.execute("SELECT version FROM schema_version").fetchall()
        done = {int(str(row[0])) for row in rows}
        for version, name, sql in migrations():
            if version in done:
                continue
            conn.execute(sql.encode())
            conn.execute(
                "INSERT INTO schema_version (version, name) VALUES (%s, %s)", (version, name)
            )
            applied.append(version)
    return applied
