"""Privacy budgets, the ledger of charges, and the answer cache, kept in the `dpsql` schema of PostgreSQL.

- `budget`: what an answer costs (basic composition and zCDP), the two privacy filters, what is left;
- `ledger`: analysts and charges, committed before a query runs, never overspent under concurrency;
- `answers`: the answer already released for a query, returned again at no cost;
- `zcdp`: the conversion between ρ and (ε, δ).
Over many queries the zCDP account is much tighter (50 answers at ε = 0.1 cost 5 under basic composition
and 3.41 under zCDP for an analyst's δ of 1e-5); for a few large ones basic composition is.
"""

from __future__ import annotations

from dpsql.accounting import zcdp
from dpsql.accounting.answers import AnswerCache
from dpsql.accounting.budget import (
    MAX_DELTA,
    MIN_EPSILON,
    NO_COST,
    Budget,
    Cost,
    describe_budget,
    group_guarantee,
    validate_epsilon,
    validate_query_privacy,
)
from dpsql.accounting.ledger import Ledger, new_hash_seed

__all__ = ["MAX_DELTA", "MIN_EPSILON", "NO_COST", "AnswerCache", "Budget", "Cost", "Ledger", "describe_budget",
           "group_guarantee", "new_hash_seed", "validate_epsilon", "validate_query_privacy", "zcdp"]
