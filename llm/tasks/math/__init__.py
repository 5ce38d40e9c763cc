"""Competition math: problems and prompts, loaders, grading, the subprocess grader pool and the registered task."""
