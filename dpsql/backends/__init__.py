"""Where the rewritten SQL runs. PostgreSQL through psycopg 3 for now."""

from dpsql.backends.postgres import Cancellation, PostgresBackend

__all__ = ["Cancellation", "PostgresBackend"]
