"""Answers as the answer cache keeps them (JSON in the ledger's dpsql.answers), and back."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from typing import Any

from dpsql.accounting import Budget
from dpsql.accounting.answers import decode_value, encode_value
from dpsql.answer import Answer
from dpsql.local.estimates import DEBIASED_INTERVALS
from dpsql.postprocess import INTERVALS_COVER, Accuracy
from dpsql.prepared import Prepared


def answer_key(*parts: Any) -> str:
    """The cache's key of an answer: a hash of everything that makes it this answer (the canonical query, its ε
    and options, the schema's digest, ...), each part as JSON."""
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()


ACCURACY_FIELDS = tuple(f.name for f in fields(Accuracy))  # astuple would deep-copy each value (a tenth of a query)


def encode_answer(answer: Answer) -> dict:
    return {
        "names": answer.names, "types": answer.types, "epsilon": answer.epsilon, "delta": answer.delta,
        "notes": answer.notes,
        "rows": [[encode_value(v) for v in row] for row in answer.rows],
        "accuracy": [[None if a is None else [encode_value(getattr(a, name)) for name in ACCURACY_FIELDS] for a in row]
                     for row in answer.accuracy],
    }


def decode_answer(data: dict, prepared: Prepared, cached: bool, budget: Budget | None) -> Answer:
    """The stored answer under the names of the query asking: one stored answer serves every spelling."""
    names = [output.name for output in prepared.plan.outputs]
    noisy = [output.noisy for output in prepared.plan.outputs]
    rows = [tuple(decode_value(v) for v in row) for row in data["rows"]]
    accuracy = [tuple(None if a is None else Accuracy(*map(decode_value, a)) for a in row) for row in data["accuracy"]]
    return Answer(names, data["types"], rows, accuracy, 0.0 if cached else data["epsilon"],
                  0.0 if cached else data["delta"], cached, budget, noisy,
                  DEBIASED_INTERVALS if prepared.plan.local_key else INTERVALS_COVER, notes=data.get("notes", []))
