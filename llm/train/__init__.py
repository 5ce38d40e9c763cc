"""Training: the loop (`trainer`), the behaviour policy batch (`behaviour`), the policy update (`update`)."""
