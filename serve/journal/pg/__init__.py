"""The journal on PostgreSQL (``--journal-url``): see :mod:`serve.journal.pg.database` and
docs/postgres-journal.md. Needs the ``postgres`` extra (psycopg 3 and psycopg-pool)."""

from serve.journal.pg.committer import PgSessionJournal
from serve.journal.pg.database import LEASE_TTL_MS, RENEW_INTERVAL_MS, PgJournal

__all__ = ["LEASE_TTL_MS", "RENEW_INTERVAL_MS", "PgJournal", "PgSessionJournal"]
