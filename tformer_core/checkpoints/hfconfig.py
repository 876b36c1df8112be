"""Reading a checkpoint's JSON files (config.json, generation_config.json, preprocessor_config.json) with checks.

Every value a converter reads goes through `HFConfig`, so a missing key, a value of the wrong type or an
absurd size becomes a `CheckpointError` that names the file, the key and what was expected, e.g.
"config.json: hidden_size must be a positive whole number, got 'abc'", instead of a KeyError or a
TypeError deep inside a constructor.

The upper bounds are far above any model tformer can show (the parameter limit, `limits.max_params`,
refuses big models with a better message); they exist so that a hostile or mistyped config cannot make
the loader build millions of modules or compute an enormous table before that limit is checked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import CheckpointError

__all__ = ["MAX_JSON_BYTES", "MAX_LAYERS", "MAX_SIZE", "HFConfig", "read_json"]

MAX_JSON_BYTES = 16_000_000  # a config.json is a few kB; ImageNet-21k's id2label is about 1 MB
MAX_LAYERS = 256  # GPT-2 XL has 48; the meta dry run builds every block, so this bounds its cost
MAX_SIZE = 1 << 20  # widths, vocabularies, positions: 1,048,576 (real models: at most a few 100,000)

_REQUIRED = object()
_ABSENT = object()


def read_json(path: Path, shown: str | None = None) -> dict[str, Any]:
    """A JSON object from `path`; CheckpointError naming `shown` (default: the file's name) when it is not one."""
    shown = shown or path.name
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise CheckpointError(f"{shown} is {size / 1e6:.0f} MB; a model's {shown} is a few kB: it is not one")
        text = path.read_bytes().decode("utf-8")
        values = json.loads(text)
    except CheckpointError:
        raise
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{shown} is not a text file (it should hold JSON)") from error
    except json.JSONDecodeError as error:
        raise CheckpointError(
            f"{shown} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
        ) from error
    except RecursionError as error:  # "[[[[...": nested deeper than Python's parser goes
        raise CheckpointError(f"{shown} is not a usable JSON file (it is nested too deeply)") from error
    except OSError as error:
        raise CheckpointError(f"{shown} cannot be read ({error.strerror or type(error).__name__})") from error
    if not isinstance(values, dict):
        raise CheckpointError(f"{shown} must hold a JSON object {{...}}, not a {_kind(values)}")
    return values


def _kind(value: Any) -> str:
    return {list: "list", str: "text", bool: "true/false value", type(None): "null"}.get(type(value), "number")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class HFConfig:
    """The values of one JSON file, read with checks; each failure names the file and the key.

    `default` (any value, None included) is returned when the key is absent or null; without one the key
    is required.
    """

    def __init__(self, values: dict[str, Any], file: str = "config.json") -> None:
        if not isinstance(values, dict):
            raise CheckpointError(f"{file} must hold a JSON object {{...}}, not a {_kind(values)}")
        self.values, self.file = values, file

    def __contains__(self, key: str) -> bool:
        return self.values.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value

    def _get(self, key: str, default: Any, what: str) -> Any:
        """The value, or _ABSENT when it is absent or null and has a default; CheckpointError when required."""
        value = self.values.get(key)
        if value is None:
            if default is _REQUIRED:
                raise CheckpointError(f"{self.file} has no {key} ({what}), which this model needs")
            return _ABSENT
        return value

    def fail(self, key: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.file}: {key} {problem}")

    def whole(self, key: str, default: Any = _REQUIRED, *, low: int = 1, high: int = MAX_SIZE) -> Any:
        """An int in [low, high]; 768.0 is read as 768, true / "768" / 1.5 are refused."""
        value = self._get(key, default, "a whole number")
        if value is _ABSENT:
            return default
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            adjective = "positive " if low == 1 else ""
            raise self.fail(key, f"must be a {adjective}whole number, got {_shown(value)}")
        if value < low:
            if low == 1:
                raise self.fail(key, f"must be a positive whole number, got {value}")
            raise self.fail(key, f"must be at least {low}, got {value}")
        if value > high:
            raise self.fail(key, f"is {value:,}: more than tformer handles (at most {high:,})")
        return value

    def layers(self, key: str, default: Any = _REQUIRED) -> Any:
        return self.whole(key, default, high=MAX_LAYERS)

    def token_id(self, key: str, default: Any = None) -> Any:
        """A token id (a whole number from 0), or `default`."""
        return self.whole(key, default, low=0, high=MAX_SIZE * 4)

    def number(self, key: str, default: Any = _REQUIRED, *, positive: bool = True) -> Any:
        """A finite float (an int is accepted); positive unless told otherwise."""
        value = self._get(key, default, "a number")
        if value is _ABSENT:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"must be a number, got {_shown(value)}")
        if positive and value <= 0:
            raise self.fail(key, f"must be a positive number, got {value}")
        return float(value)

    def text(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default, "a name")
        if value is _ABSENT:
            return default
        if not isinstance(value, str):
            raise self.fail(key, f"must be a name in quotes, got {_shown(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default, "true or false")
        if value is _ABSENT:
            return default
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_shown(value)}")
        return value

    def heads_divide(self, heads_key: str, heads: int, width_key: str, width: int) -> None:
        """Heads split the width evenly (each head gets width / heads dimensions)."""
        if width % heads:
            raise CheckpointError(
                f"{self.file}: {heads_key} ({heads}) must divide {width_key} ({width}) evenly: "
                "each head takes an equal share of the width"
            )
