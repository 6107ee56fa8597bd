"""Noise and selection primitives. They know nothing of SQL; each carries its own privacy map."""

from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.mechanisms.partition import PartitionSelection
from dpsql.mechanisms.samplers import bernoulli_exp, discrete_gaussian, discrete_laplace

__all__ = ["LaplaceMechanism", "PartitionSelection", "bernoulli_exp", "discrete_gaussian", "discrete_laplace"]
