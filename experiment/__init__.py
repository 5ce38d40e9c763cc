"""The experiment layer both drivers stand on (floor 2): one option vocabulary, one sweep grammar,
an atomic results store with provenance, frontier statistics, one results schema, lift tables and
frontier plots. Imports theory and shaping only (never toymdp or llm); see docs/architecture.md.
"""

import numerics  # noqa: F401  (pins numpy's and OpenBLAS's code paths before numpy loads)
