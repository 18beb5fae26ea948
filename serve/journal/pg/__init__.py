"""The journal on PostgreSQL (``--journal-url``): see :mod:`serve.journal.pg.journal` and
docs/postgres-journal.md. Needs the ``postgres`` extra (psycopg 3 and psycopg-pool)."""

from serve.journal.pg.journal import LEASE_TTL_MS, RENEW_INTERVAL_MS, PgJournal
from serve.journal.pg.writer import PgSessionJournal

__all__ = ["LEASE_TTL_MS", "RENEW_INTERVAL_MS", "PgJournal", "PgSessionJournal"]
