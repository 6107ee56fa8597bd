"""Locally private data: columns collected under local differential privacy, in one package.

- this module: what runs on a person's device before a value is sent (`randomize`);
- `ingest`: loading already-randomized reports into a table (`dpsql ingest`);
- `estimates`: answering a query over them by post-processing (unbiased estimates with exact variances);
- the randomizers themselves are mechanisms, pure and free of SQL, with the others in `dpsql.mechanisms.local`.

"Local" in dpsql means local differential privacy only; what a query reads that is already private (these
reports, or released tables) is `Prepared.already_private`.

Collection, on the device:

    >>> from dpsql.local import randomize
    >>> randomize(True, {"mechanism": "rr", "epsilon": 1.0})                      # a boolean, flipped or not
    >>> randomize("b", {"mechanism": "krr", "epsilon": 1.0, "domain": ["a", "b", "c"]})
    >>> randomize((3.2, 7.9), {"mechanism": "geo", "epsilon": 0.5,
    ...                        "grid": {"x": [0, 10], "y": [0, 10], "step": 1}})   # a cell id

The column spec is the column's `local` table from the privacy schema (with the column's `domain` where the
mechanism needs one), or a `Column` of a loaded schema. Randomness comes from the OS CSPRNG; the samplers are
those of `dpsql.mechanisms.local`, so what a device sends is exactly what the schema says it is.
"""

from __future__ import annotations

import functools
from typing import Any

from dpsql.mechanisms.local import (
    Grid,
    KaryResponse,
    OptimalObfuscation,
    PlanarLaplace,
    UnaryEncoding,
    randomized_response,
)
from dpsql.schema.model import Column, LocalRandomizer
from dpsql.schema.validate import parse_schema

Randomizer = KaryResponse | UnaryEncoding | PlanarLaplace | OptimalObfuscation
COLUMN_TYPE = {"rr": "boolean", "krr": "text", "oue": "boolean[]", "geo": "integer", "geo-lp": "integer"}


@functools.lru_cache(maxsize=64)
def randomizer(spec: LocalRandomizer) -> Randomizer:
    """The mechanism a local column declares (an optimal obfuscation is solved once per process)."""
    if spec.mechanism == "rr":
        return randomized_response(spec.epsilon)
    if spec.mechanism == "krr":
        return KaryResponse(spec.epsilon, spec.labels)
    if spec.mechanism == "oue":
        return UnaryEncoding(spec.epsilon, spec.labels)
    grid = Grid(*spec.grid)
    if spec.mechanism == "geo":
        return PlanarLaplace(spec.epsilon, grid)
    return OptimalObfuscation(spec.epsilon, grid, spec.prior)


def randomize(value: Any, column: dict[str, Any] | Column | LocalRandomizer) -> Any:
    """The report a device sends for its true `value`: a boolean (rr), a domain value (krr), a tuple of
    booleans (oue), or a grid cell id for a location (x, y) (geo, geo-lp)."""
    return randomizer(local_spec(column)).randomize(value)


def local_spec(column: dict[str, Any] | Column | LocalRandomizer) -> LocalRandomizer:
    """A column's randomizer, from any of the forms `randomize` takes (a dict is checked as the schema is)."""
    if isinstance(column, LocalRandomizer):
        return column
    if isinstance(column, Column):
        if column.local is None:
            raise ValueError(f"column {column.name} is not declared with local = {{ ... }}")
        return column.local
    spec = dict(column)
    domain = spec.pop("domain", None)
    mechanism = spec.get("mechanism")
    declared = {"type": COLUMN_TYPE.get(mechanism, "text") if mechanism != "krr" or not domain
                or isinstance(domain[0], str) else "integer", "local": spec}
    if domain is not None:
        declared["domain"] = list(domain)
    schema = parse_schema({"privacy": {"unit": "row"}, "tables": {
        "reports": {"columns": {"value": declared}}, "private": {"columns": {"x": "integer"}}}}, "the column spec")
    return schema.tables["reports"].columns["value"].local


__all__ = ["local_spec", "randomize", "randomizer"]
