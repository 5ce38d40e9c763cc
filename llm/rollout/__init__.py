"""Rollout backends: the contract (`base`), transformers (`hf`), vLLM (`vllm_engine`, `vllm_convert`), and `backend.make_backend`."""
