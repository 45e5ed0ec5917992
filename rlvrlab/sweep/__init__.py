"""`rlvrlab sweep`: Optuna studies over config keys with several seeds per trial (spec, study, summary)."""
