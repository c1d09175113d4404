"""JSON rows read from a user's file, with the two failures ``json.loads`` does not report as bad JSON.

A line of a hundred thousand ``[`` raises RecursionError inside the decoder, and an integer of 5,000 digits
a ValueError (Python converts at most 4,300 digits to an int). ``loads`` raises both as the
``json.JSONDecodeError`` a reader already handles for a syntax error, with a message that says which.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def loads(text: str) -> Any:
    """``json.loads(text)``; nesting past the interpreter's recursion limit or an integer too long to convert is
    a ``json.JSONDecodeError`` (its ``msg`` says which), as a syntax error is."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError(f"nested deeper than {sys.getrecursionlimit()} levels", text, 0) from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # Python's limit on int(str): "Exceeds the limit (4300 digits) ..."
        raise json.JSONDecodeError(f"an integer of more than {sys.get_int_max_str_digits()} digits", text, 0) from None
