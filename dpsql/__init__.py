"""dpsql: a differentially private SQL proxy for PostgreSQL.

`dpsql.connect(...)` is the PEP 249 door; see `dpsql.dbapi`.
"""

from dpsql.dbapi import *  # noqa: F403 - the PEP 249 module's names are the package's
from dpsql.dbapi import __all__  # noqa: F401

__version__ = "0.1.0"
