"""The run: torch.distributed setup (`distributed`), checkpoints (`checkpoint`), the run folder and
its lock (`folder`)."""
