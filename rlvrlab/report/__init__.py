"""`rlvrlab report`: runs from MLflow grouped by configuration, t-intervals, paired comparisons, tables and plots."""
