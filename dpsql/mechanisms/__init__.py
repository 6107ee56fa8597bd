"""Noise and selection primitives. They know nothing of SQL; each carries its own privacy map."""

from dpsql.mechanisms.exponential import ExponentialMechanism, rank_scores, top_k
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.mechanisms.histograms import (
    StructureFirstPlan,
    noise_first,
    structure_first,
    structure_first_or_noise_first,
    v_optimal,
)
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.mechanisms.lower_bounds import exp_capped, expected_error_lower_bound, halfwidth_lower_bound
from dpsql.mechanisms.partition import PartitionSelection
from dpsql.mechanisms.samplers import bernoulli_exp, discrete_gaussian, discrete_laplace
from dpsql.mechanisms.sparse import FirstBelowThreshold

__all__ = ["ExponentialMechanism", "FirstBelowThreshold", "GaussianMechanism", "LaplaceMechanism",
           "PartitionSelection", "StructureFirstPlan", "bernoulli_exp", "discrete_gaussian", "discrete_laplace",
           "exp_capped", "expected_error_lower_bound", "halfwidth_lower_bound", "noise_first", "rank_scores",
           "structure_first", "structure_first_or_noise_first", "top_k", "v_optimal"]
