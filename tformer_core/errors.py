"""What the core raises when what a user gave cannot be used.

`InputError` (a ValueError) is the one type for "your input is the problem": text, numbers, a picture, a
model id, a file. Its message is meant for the user and says what to change. Any other exception is a bug
(in tformer, or in a library under it): the app shows those as "something went wrong" with an id it also
writes to the server's log, never as if the input were wrong. Subclasses say where the input came from:
`CheckpointError` (a model and its files), `ImageError` (a picture), the lessons' `TableError`.

`HookNameError` is of the other sort: an edit names an activation the model has no hook point for, a mistake
in the code that built the edit (a notebook's, or the app's), so it is not an `InputError`.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["HookNameError", "InputError"]


class InputError(ValueError):
    """Something the user gave cannot be used; the message says why and what to do, for the user."""


class HookNameError(KeyError, ValueError):
    """Edits name activations that no hook point of the model has (`model.hook_names`): they would never apply.

    closest: each unknown name -> the model's names closest to it (at most three, closest first; empty when none
    is close). A KeyError as `trace[name]` raises for a name it does not hold, and a ValueError (a bad argument).
    """

    def __init__(self, closest: Mapping[str, tuple[str, ...]], n_hook_points: int) -> None:
        self.closest = dict(closest)
        lines = []
        for name, near in self.closest.items():
            if near:
                hint = "closest: " + ", ".join(f'"{n}"' for n in near)
            else:
                hint = "none is close (see model.hook_names)" if n_hook_points else "it has no hook points at all"
            lines.append(f'no hook point "{name}" in this model; {hint}')
        super().__init__("\n".join(lines))

    def __str__(self) -> str:
        return str(self.args[0])  # the message itself: KeyError's own str() would show its repr, quoted
