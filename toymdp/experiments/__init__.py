"""Toy experiments, one module per figure; importing this package registers them all.

Figure numbers: 1 the CaSP tree, 2 selection and reinforcement bias, 3 Theorem 3.4, 4 convergence of
exact-gradient training, 5 all methods, 6 pass@k on held-out prompts, 7 solution multiplicity.
"""

from toymdp.experiments import (  # noqa: F401  (registration)
    bias,
    casp_tree,
    convergence,
    methods,
    multiplicity,
    passk,
    theorem_3_4,
)
from toymdp.experiments._registry import EXPERIMENTS, Experiment, Results, register

__all__ = ["EXPERIMENTS", "Experiment", "Results", "register"]
