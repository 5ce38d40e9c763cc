"""JAX tree-MDP simulator driven by the shared `shaping/` core.

Modules (import them directly; this package imports nothing heavy on its own):

- `toymdp.env`: `TreeEnv` (one tree, or many prompts with their own correct sets, sharing the
  policy per prompt, fully, or through a shared plus a per-prompt logit component), `casp_env`,
  `single_tree`, `multi_prompt_env`, `from_correct_sets`.
- `toymdp.policy`: the tabular softmax policy in JAX: trajectory log-probs, sampling, per-token
  log-probs, entropies, top-N candidates and sampled ranks.
- `toymdp.metrics`: exact per-step metrics by enumeration (correctness, normalized variance,
  entropy, KL to base, distinct correct in K samples, pass@k, Λ^(n)).
- `toymdp.train`: `TrainConfig`, `make_train(config) -> train(settings, key)` (sampled RLVR with
  any `shaping.METHODS` entry, or exact population gradients), `default_settings`,
  `settings_grid`, `vmap_train`, `closed_form`.
- `toymdp.reference`: the NumPy per-run reference of the sampled mode.
- `toymdp.configs`: named configurations (the CaSP tree).

XLA's C++ log: importing this package sets ``TF_CPP_MIN_LOG_LEVEL=3`` unless it is set (before
JAX loads; set it to 0 to see every message). A sweep's program holds its dataset draws as
constants, and XLA's constant folding of their log-softmax takes over a second on a large
dataset, which XLA reports as an ERROR-level "slow operation alarm" with a request to file a bug.
The folding stays: the committed results' bytes are the folded constants' (the same arrays passed
as arguments instead change the metrics' last bits, by up to 4e-6).
"""

import os

import numerics  # noqa: F401  (pins XLA's, numpy's and OpenBLAS's code paths before they load)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
