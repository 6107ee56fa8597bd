"""Releases beyond one query: each reads its statistics through `Engine.release` (the same analysis, bounds and
ledger as any query), adds its own noise, is charged once, and draws its pictures from released values only.

- `density`: a kernel density estimate of a bounded column, by the Gaussian-process mechanism;
- `tree`: a decision tree whose splits the exponential mechanism chooses;
- `synth`: a synthetic table by MWEM, which `published` then answers exactly and for free.
"""

from dpsql.releases.density import density, plot_density
from dpsql.releases.tree import decision_tree, plot_tree

__all__ = ["decision_tree", "density", "plot_density", "plot_tree"]
