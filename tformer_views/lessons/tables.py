"""Reading the tables a user edits (or pastes) into matrices, with a message that names the bad cell.

X = matrix_from_frame(edited_frame, "X")        # TableError: "X, row 2 (love), column x3: 'abc' is not a number"
W = parse_matrix_text("1 0 2\n0 1 1", "W^Q")     # pasted numbers, one row per line
inputs = Inputs(); inputs.parse("X", lambda: X)  # a page's tables: a TableError is kept in inputs.errors["X"]
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from tformer_core.errors import InputError

__all__ = [
    "Inputs",
    "TableError",
    "format_matrix_text",
    "from_link_text",
    "link_text",
    "matrix_from_frame",
    "parse_matrix_text",
    "parse_tokens",
    "tokens_from_column",
]


class TableError(InputError):
    """An input table that cannot be used; the message names the table, and the cell or the shape."""


def _cell_error(name: str, row: int, row_label: Any, col_label: Any, problem: str) -> TableError:
    where = f"row {row + 1}" + (f" ({row_label})" if str(row_label) not in ("", str(row), str(row + 1)) else "")
    return TableError(f"{name}, {where}, column {col_label}: {problem}")


def _number(value: Any) -> tuple[float | None, str]:
    """(the value as a float, "") or (None, what is wrong with it)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, "empty cell"
    if isinstance(value, (bool, np.bool_)):
        return None, f"{value!r} is not a number"
    try:
        number = float(str(value).strip().replace("\u2212", "-")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None, f"{str(value)!r} is not a number"
    if math.isnan(number):
        return None, "empty cell (NaN)"
    if not math.isfinite(number):
        return None, f"{value} is not a finite number"
    return number, ""


def matrix_from_frame(frame: pd.DataFrame, name: str, skip: Sequence[str] = ()) -> np.ndarray:
    """An edited table -> float64 [rows, cols]; the columns named in `skip` (e.g. "token") are left out.

    Raises TableError naming the first bad cell by row number (and row label) and column name:
    empty / NaN cells, text that is not a number, infinities; or an empty table.
    """
    data = frame.drop(columns=[c for c in skip if c in frame.columns])
    if len(data) == 0:
        raise TableError(f"{name} is empty: it needs at least one row")
    if data.shape[1] == 0:
        raise TableError(f"{name} has no columns")
    out = np.empty(data.shape, dtype=np.float64)
    for r, (label, row) in enumerate(data.iterrows()):
        for c, col in enumerate(data.columns):
            number, problem = _number(row.iloc[c])
            if number is None:
                raise _cell_error(name, r, label, col, problem)
            out[r, c] = number
    return out


_SEPARATORS = re.compile(r"[,;\s\t]+")


def parse_matrix_text(text: str, name: str) -> np.ndarray:
    """Pasted text -> float64 [rows, cols]: one row per line, numbers separated by spaces, commas or tabs.

    Brackets are ignored, so numpy / Python list output can be pasted as is. Raises TableError
    naming the bad cell (row and column, from 1) or the rows of unequal length.
    """
    rows: list[list[str]] = []
    for line in str(text).splitlines():
        cleaned = line.replace("[", " ").replace("]", " ").strip()
        if cleaned:
            rows.append([cell for cell in _SEPARATORS.split(cleaned) if cell])
    if not rows:
        raise TableError(f"{name} is empty: type one row per line, e.g. '1 0 2'")
    for r, cells in enumerate(rows):
        if len(cells) != len(rows[0]):
            raise TableError(f"{name}: row {r + 1} has {len(cells)} numbers but row 1 has {len(rows[0])}")
    out = np.empty((len(rows), len(rows[0])), dtype=np.float64)
    for r, cells in enumerate(rows):
        for c, cell in enumerate(cells):
            number, problem = _number(cell)
            if number is None:
                raise _cell_error(name, r, "", c + 1, problem)
            out[r, c] = number
    return out


def parse_tokens(text: str) -> list[str]:
    """Token names from one line, separated by spaces (or commas)."""
    return [t for t in re.split(r"[,\s]+", str(text).strip()) if t]


def format_matrix_text(matrix: np.ndarray) -> str:
    """The inverse of parse_matrix_text: one line per row, numbers as short as they can be without loss."""
    return "\n".join(" ".join(f"{v:.6g}" for v in row) for row in np.atleast_2d(matrix))


def tokens_from_column(values: Sequence[Any]) -> list[str]:
    """Token names from an edited "token" column; empty names become their position ("#2")."""
    out = []
    for i, v in enumerate(values):
        text = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).strip()
        out.append(text or f"#{i + 1}")
    return out


def link_text(matrix: np.ndarray) -> str:
    """A matrix for a link, compactly: rows separated by ";", numbers by "," (6 significant digits),
    e.g. "1,0,2;0,1,1". `from_link_text` reads it back."""
    return ";".join(",".join(f"{float(x):.6g}" for x in row) for row in np.atleast_2d(matrix))


def from_link_text(text: str, name: str) -> np.ndarray:
    """A matrix from `link_text`; TableError naming `name` when the text is not one."""
    rows = [row for row in str(text).split(";") if row.strip()]
    if not rows:
        raise TableError(f"{name}: the link holds no numbers")
    return parse_matrix_text("\n".join(row.replace(",", " ") for row in rows), name)


class Inputs:
    """Parsed tables: each matrix by name, or None with its message in `errors` (keyed by the same name).

    One bad table does not stop the page: the parts that do not need it are still drawn.
    """

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.values: dict[str, np.ndarray | None] = {}
        self.errors: dict[str, str] = {}

    def parse(self, name: str, read: Callable[[], np.ndarray]) -> None:
        try:
            self.values[name] = read()
        except TableError as error:
            self.values[name] = None
            self.errors[name] = str(error)
