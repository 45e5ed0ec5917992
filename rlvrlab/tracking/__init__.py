"""Tracking: the MLflow tracker, provenance of runs, the MLflow tag names (`tags`) and run selection."""
