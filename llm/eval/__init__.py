"""Evaluation: held-out pass@k and diversity (`heldout`), embeddings and Self-BLEU helpers (`diversity`)."""
