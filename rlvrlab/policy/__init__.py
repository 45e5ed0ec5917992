"""Policies: the tiny tier (a small Qwen2 built offline with its own tokenizer) and its warm start."""
