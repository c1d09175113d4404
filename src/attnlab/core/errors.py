"""User-facing errors.

Anything the user can cause (a bad config, a missing file, an unknown character) raises an
``AttnlabError`` whose message is one line naming the problem. The CLI prints it and exits 2;
``--debug`` shows the traceback instead.
"""


class AttnlabError(Exception):
    """Base class for errors caused by user input; the message is shown as-is on one line."""


class ConfigError(AttnlabError, ValueError):
    """A config file or ``key=value`` override is malformed, unknown or out of range."""


class DataError(AttnlabError, ValueError):
    """A data file is missing, empty, binary, not UTF-8, or too short."""


class TokenizerError(AttnlabError, ValueError):
    """Text cannot be encoded (e.g. characters outside a char vocabulary) or a tokenizer file is bad."""


class CheckpointError(AttnlabError, ValueError):
    """A checkpoint or pretrained folder is missing, corrupt, or does not match its config."""
