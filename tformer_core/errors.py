"""What the core raises when what a user gave cannot be used.

`InputError` (a ValueError) is the one type for "your input is the problem": text, numbers, a picture, a
model id, a file. Its message is meant for the user and says what to change. Any other exception is a bug
(in tformer, or in a library under it): the app shows those as "something went wrong" with an id it also
writes to the server's log, never as if the input were wrong. Subclasses say where the input came from:
`CheckpointError` (a model and its files), `ImageError` (a picture), the lessons' `TableError`.
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """Something the user gave cannot be used; the message says why and what to do, for the user."""
