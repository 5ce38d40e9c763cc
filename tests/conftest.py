"""Shared test configuration: Hypothesis profiles.

`default` is deterministic (derandomized, no deadline) so CI is reproducible; set
`HYPOTHESIS_PROFILE=explore` for a slower randomized search with more examples.
"""

import importlib.util
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    derandomize=True,
    deadline=None,
    print_blob=True,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    deadline=None,
    print_blob=True,
    max_examples=1000,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# tests/vllm_api checks our vLLM calls against the real vLLM (`make test-vllm`, its own venv with the
# `gpu` extra); without vLLM installed it is not collected at all.
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm_api"]
