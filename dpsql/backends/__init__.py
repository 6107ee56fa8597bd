"""Where the rewritten SQL runs. PostgreSQL through psycopg 3 for now."""

from dpsql.backends.postgres import PostgresBackend

__all__ = ["PostgresBackend"]
