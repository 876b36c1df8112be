"""The one exception the checkpoint loaders raise."""

from __future__ import annotations

from ..errors import InputError

__all__ = ["CheckpointError"]


class CheckpointError(InputError):
    """A model could not be loaded; the message says why and what to do, for the user.

    Messages name the file and the problem ("config.json: hidden_size must be a positive whole number,
    got 'abc'") and never show a server path: local models are named relative to their model folder.
    """
