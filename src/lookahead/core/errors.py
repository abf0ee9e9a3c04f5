"""The errors a user can fix: a stage prints their message alone and exits non-zero (docs/troubleshooting.md)."""

from __future__ import annotations


class LookaheadError(Exception):
    """An error the user can fix (bad params, missing data, diverged training): a stage prints
    its message alone, without a traceback, and exits non-zero."""


class ConfigError(LookaheadError, ValueError):
    """A params value is unknown, missing, of the wrong type or out of range."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix`` prepended to its key."""
        key = f"{prefix}.{self.key}" if self.key else prefix
        return ConfigError(key, self.message)


def require(condition: bool, key: str, message: str) -> None:
    """Raise ``ConfigError(key, message)`` unless ``condition`` holds (for ``__post_init__``)."""
    if not condition:
        raise ConfigError(key, message)
