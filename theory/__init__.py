"""Exact closed forms over tree MDPs and one numerical checker per theorem (`python -m theory check`)."""

import numerics  # noqa: F401  (pins numpy's and OpenBLAS's code paths before numpy loads)
