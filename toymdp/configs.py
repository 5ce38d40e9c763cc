"""Named configurations shared by the benchmark, the tests and the figure scripts.

The CaSP paper (seed 004, Fig. 5) publishes neither its learning rate, number of steps, group size
nor coefficients, so the values below are this project's choice: a uniform base policy, groups of
8, Adam at learning rate 0.1 for 200 updates of one epoch each, and the registry's default
hyper-parameters. Figures must state them and show sensitivity to them.
"""

from __future__ import annotations

from toymdp.env import casp_env
from toymdp.train import TrainConfig

#: Settings of the CaSP-tree runs (overridable by keyword in `casp_config`).
CASP_DEFAULTS: dict[str, object] = {
    "group_size": 8,
    "num_updates": 200,
    "num_epochs": 1,
    "optimizer": "adam",
    "learning_rate": 0.1,
    "distinct_k": (1000,),
}


def casp_config(method: str = "grpo", **overrides: object) -> TrainConfig:
    """The sampled-mode config of the CaSP tree (seed 004, Fig. 5) for `method`.

    Raises:
        ValueError: from `TrainConfig`, naming the field.
    """
    return TrainConfig(casp_env(), method=method, **{**CASP_DEFAULTS, **overrides})
