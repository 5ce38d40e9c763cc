"""GRPO-family trainer for language models on torch + transformers (`python -m llm ...`)."""

import numerics  # noqa: F401  (pins torch's, numpy's and XLA's code paths before they load)
