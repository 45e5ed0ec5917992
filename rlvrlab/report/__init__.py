"""`rlvrlab report`: runs from MLflow grouped by configuration, bootstrap intervals, tables and plots."""
