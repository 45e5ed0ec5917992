"""The domain errors: a user mistake the CLI shows as one line, without a traceback."""


class RlvrlabError(Exception):
    """A mistake the user can fix. Its message is one line: what is wrong, then how to fix it."""


class ConfigError(RlvrlabError):
    """An experiment file, group file or override that does not make a valid RunConfig."""
