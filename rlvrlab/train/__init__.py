"""The training loop and what it is made of: batches, checkpoints, run setup."""
