"""Evaluation: unbiased pass@k, exact expected maj@k, avg@n and diversity (passk), sampling and records (run)."""
