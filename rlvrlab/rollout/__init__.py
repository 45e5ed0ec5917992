"""Rollout engines: sample `n` responses per prompt from the current policy (hf, vllm, toy)."""
