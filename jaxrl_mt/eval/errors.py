"""The evaluation's error type (a bad config field, a malformed transcript line)."""


class EvalError(ValueError):
    """Bad evaluation input (config value, data, workdir); the message is one line naming it."""
