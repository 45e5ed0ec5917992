"""The domain errors: a user mistake the CLI shows as one line, without a traceback."""


class RlvrlabError(Exception):
    """A mistake the user can fix. Its message is one line: what is wrong, then how to fix it."""


class ConfigError(RlvrlabError):
    """An experiment file, group file or override that does not make a valid RunConfig."""


class StorageError(RlvrlabError):
    """A write that the place refused, not the work: a full disk or a sqlite store another process holds. Nothing is
    wrong with what was asked; the same command (or a resume) goes on once space is freed or the store released.
    what: the trouble alone, without how to go on (a caller that goes on differently words its own message)."""

    def __init__(self, message: str, *, what: str | None = None):
        super().__init__(message)
        self.what = what or message
