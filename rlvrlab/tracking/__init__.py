"""Tracking: MLflow records of every run; metric names exist only in tracking.metrics."""
