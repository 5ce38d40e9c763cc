"""Evaluation: held-out pass@k, maj@k and diversity (`heldout`), maj@k and entropy of the answers
(`answers`), token entropy and KL to a base model (`token_stats`), embeddings and Self-BLEU helpers
(`diversity`)."""
