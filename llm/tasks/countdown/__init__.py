"""Countdown (seed 000, App. C.1): problems, loaders, grading, the exhaustive solver and the registered task."""
