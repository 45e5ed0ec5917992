"""rlvrlab's algorithms inside other trainers (`rlvrlab.integrations.verl`: UCPO and UP in verl's registries).

Nothing is imported here: each integration imports its trainer, which only that trainer's environment has.
"""
