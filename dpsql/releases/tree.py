"""A DP decision tree classifier (Friedman and Schuster, "Data mining with differential privacy", KDD 2010).

The engine counts the rows of every combination of the features and the label (all declared: a domain, a
boolean, or a bounded number cut into equal bins by `width_bucket`), with each unit's rows bounded as in any
query: one unit moves these counts by at most k in all. The tree is grown from those exact counts to a fixed
depth. At each node the split attribute is chosen by the exponential mechanism over the Gini score
-Σ_v (|S_v| - Σ_c |S_v,c|² / |S_v|), which one row moves by at most 2 (Friedman and Schuster), so one unit by
2k; the nodes of one level hold disjoint rows, and a unit's rows spread over several nodes move each node's score
in proportion, so one level costs its ε once (parallel composition). Half of ε goes to the splits, spread evenly
over the levels; the other half to Laplace noise on the leaves' class counts (sensitivity k over all leaves).
A leaf predicts its class of largest noisy count.
"""

from __future__ import annotations

import json
from typing import Any

from dpsql.accounting import Cost, validate_query_privacy
from dpsql.errors import InvalidParameter, UnknownColumn
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.schema import Column

MAX_DEPTH = 8
SPLIT_SHARE = 0.5  # of ε, for the splits (the rest for the leaves)


def gini_score(counts: dict[Any, dict[Any, float]]) -> float:
    """Friedman and Schuster's Gini score of a split: counts[value][label] over the node's rows (higher is
    better; one row moves it by at most 2)."""
    score = 0.0
    for by_label in counts.values():
        size = sum(by_label.values())
        if size > 0:
            score -= size - sum(c * c for c in by_label.values()) / size
    return score


def decision_tree(engine: Any, analyst: str, table: str, label: str, features: list[str], epsilon: float,
                  depth: int = 3, bins: int = 4) -> dict:
    """Grow and release the tree (JSON: the tree, its features' cells, its cost), charged to `analyst` once."""
    validate_query_privacy(epsilon)
    if not 1 <= depth <= MAX_DEPTH:
        raise InvalidParameter(f"depth must be from 1 to {MAX_DEPTH}")
    if not 2 <= bins <= 32:
        raise InvalidParameter("bins must be from 2 to 32")
    declared = engine.schema.tables.get(table.lower())
    if declared is None:
        raise UnknownColumn(f'table "{table}" is not declared in the privacy schema',
                            "name a table the privacy schema declares (`dpsql schema check FILE` lists them)")
    names = [f.strip().lower() for f in features if f.strip()]
    if not names or label.lower() in names or len(set(names)) != len(names):
        raise InvalidParameter("give one or more distinct features, none of them the label")
    columns = [_column(declared.columns, name, table) for name in [*names, label.lower()]]
    keys = [_key(c, bins) for c in columns]
    sql = (f"SELECT {', '.join(f'{k} AS c{i}' for i, k in enumerate(keys))}, COUNT(*) FROM {declared.name} "
           f"GROUP BY {', '.join(f'c{i}' for i in range(len(keys)))}")
    split_epsilon = epsilon * SPLIT_SHARE / depth
    leaf_epsilon = epsilon * (1 - SPLIT_SHARE)

    def mechanism(statistics: list) -> dict:
        (counts,) = statistics
        rows = {k: v for k, v in counts.totals().items() if None not in k}
        k = counts.sensitivity
        chooser = ExponentialMechanism(2 * k, split_epsilon)
        leaves = LaplaceMechanism.calibrate(k, leaf_epsilon, integer_valued=True)
        domains = [sorted({key[i] for key in rows}, key=repr) for i in range(len(columns))]
        tree = _grow(rows, list(range(len(names))), depth, domains, chooser, leaves)
        return {"table": declared.name, "label": columns[-1].name, "features": names, "depth": depth,
                "epsilon": epsilon, "split_epsilon_per_level": split_epsilon, "leaf_epsilon": leaf_epsilon,
                "cells": {c.name: _describe_cells(c, bins) for c in columns[:-1]}, "tree": tree}

    released = engine.release(analyst, "tree", [sql], Cost.pure(epsilon), mechanism,
                              {"depth": depth, "bins": bins})
    return {**released.output, "cached": released.cached, "epsilon_spent": 0.0 if released.cached else epsilon}


def _column(columns: dict[str, Column], name: str, table: str) -> Column:
    column = columns.get(name)
    if column is None:
        raise UnknownColumn(f'column "{name}" is not declared in table {table}',
                            "name a column the privacy schema declares for the table ("
                            "`dpsql schema check FILE` lists them)")
    if column.local is not None or not (column.domain or column.type == "boolean"
                                        or (column.is_numeric and column.bounded)):
        raise InvalidParameter(f"{table}.{name} needs a declared domain, a boolean type, or numeric bounds",
                               "declare domain = [...] or lower/upper in the privacy schema")
    return column


def _key(column: Column, bins: int) -> str:
    if column.domain or column.type == "boolean":
        return column.name
    return f"width_bucket({column.name}, {column.lower!r}, {column.upper!r}, {bins})"


def _describe_cells(column: Column, bins: int) -> str:
    if column.domain or column.type == "boolean":
        return "its values"
    width = (column.upper - column.lower) / bins
    return (f"width_bucket cells: j covers [{column.lower:g} + (j-1)·{width:g}, {column.lower:g} + j·{width:g}), "
            f"{bins + 1} is the upper bound itself")


def _grow(rows: dict[tuple, float], attributes: list[int], depth: int, domains: list[list], chooser:
          ExponentialMechanism, leaves: LaplaceMechanism) -> dict:
    """One node over `rows` (key tuple -> count): a split chosen by the exponential mechanism, or a leaf."""
    if depth == 0 or not attributes:
        labels = {}
        for key, count in rows.items():
            labels[key[-1]] = labels.get(key[-1], 0.0) + count
        noisy = {str(value): max(0.0, leaves.release(labels.get(value, 0.0))) for value in domains[-1]}
        return {"leaf": noisy, "predict": max(noisy, key=noisy.get) if noisy else None}
    scores = []
    for attribute in attributes:
        split: dict[Any, dict[Any, float]] = {}
        for key, count in rows.items():
            split.setdefault(key[attribute], {}).setdefault(key[-1], 0.0)
            split[key[attribute]][key[-1]] += count
        scores.append(gini_score(split))
    attribute = attributes[chooser.select(scores)]
    rest = [a for a in attributes if a != attribute]
    children = {}
    for value in domains[attribute]:
        subset = {key: count for key, count in rows.items() if key[attribute] == value}
        children[json.dumps(value)] = _grow(subset, rest, depth - 1, domains, chooser, leaves)
    return {"split": attribute, "children": children}


def predict(release: dict, row: dict[str, Any]) -> Any:
    """The label the released tree predicts for `row` (feature name -> its value, or its cell for a binned
    numeric feature)."""
    node = release["tree"]
    while "split" in node:
        value = row[release["features"][node["split"]]]
        child = node["children"].get(json.dumps(value))
        if child is None:
            break
        node = child
    while "split" in node:  # an unseen value: follow the first branch
        node = next(iter(node["children"].values()))
    return node["predict"]


def render_tree(release: dict) -> str:
    """The tree as indented text."""
    lines = [f"DP decision tree for {release['label']} over {release['table']} (ε = {release['epsilon']:g}: "
             f"{release['split_epsilon_per_level']:.4g} per level of splits, {release['leaf_epsilon']:.4g} on the "
             "leaves' counts)"]

    def walk(node: dict, indent: str) -> None:
        if "leaf" in node:
            counts = ", ".join(f"{k}: {v:.0f}" for k, v in node["leaf"].items())
            lines.append(f"{indent}predict {node['predict']}  (noisy counts {counts})")
            return
        name = release["features"][node["split"]]
        for value, child in node["children"].items():
            lines.append(f"{indent}{name} = {value}:")
            walk(child, indent + "    ")

    walk(release["tree"], "  ")
    return "\n".join(lines)


def plot_tree(release: dict, path: str) -> None:
    """The tree as a picture: its text drawn in a figure (released values only)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = render_tree(release)
    height = 0.22 * (text.count("\n") + 2)
    fig = plt.figure(figsize=(10, max(2.0, height)))
    fig.text(0.01, 0.99, text, family="monospace", fontsize=8, va="top")
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["decision_tree", "gini_score", "plot_tree", "predict", "render_tree"]
