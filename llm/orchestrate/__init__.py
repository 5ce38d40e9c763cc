"""Orchestration, above training: sweeps (`sweep`), their jobs (`jobs`) and where they run
(`executor`: local processes or Ray), two-stage studies (`study`) and the CPU stage of
``make reproduce`` (`reproduce`)."""
