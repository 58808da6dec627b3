"""The one base class for errors a person can fix.

An error that derives from :class:`UserError` carries a message written for the person who
sent the input (a bad tool definition, an unreadable trace file, a refused setting): the UI
shows that message and nothing else. Any other exception is a bug or an environment failure;
the UI shows its class name and a shortened message, and the server log keeps the traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """Something the person can fix; ``str(e)`` says what, in plain words."""


class ModelBuildError(UserError, RuntimeError):
    """An offline model or vocabulary could not be found or built (the message says what to
    install or free); still a RuntimeError for callers that catch it as one."""


class TokenizerLoadError(UserError):
    """A tokenizer or template could not be loaded; the message says what to do."""
