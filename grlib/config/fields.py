"""Typed fields: ConfigError, the one-line field check, and applying a mapping of YAML / JSON values
to a frozen dataclass with every value checked (and losslessly converted) against its declared type.

    apply(ModelConfig(), {"n_layers": 2}, "model.")           # -> ModelConfig(n_layers=2, ...)
    apply(ModelConfig(), {"n_layer": 2}, "model.")            # ConfigError: unknown parameter 'model.n_layer'; ...
    nest({"model.n_layers": 2})                               # -> {"model": {"n_layers": 2}}
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A bad scale, section, field or value in params.yaml or an override."""


def check(cond: bool, name: str, msg: str) -> None:
    """Raises ConfigError '<name>: <msg>' unless `cond`."""
    if not cond:
        raise ConfigError(f"{name}: {msg}")


def one_of(value: Any, valid: tuple[str, ...], name: str) -> None:
    """Raises ConfigError "<name>: <value> is not one of <valid>" unless value is in the choice list."""
    check(value in valid, name, f"{value!r} is not one of {valid}")


def coerce(value: Any, typ: Any, name: str) -> Any:
    """Checks (and losslessly converts) a YAML/JSON value to a field's declared type."""
    origin = typing.get_origin(typ)
    if origin in (list, tuple):
        check(isinstance(value, (list, tuple)), name, f"expected a list, got {value!r}")
        (inner, *_) = typing.get_args(typ) or (Any,)
        items = [coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        check(isinstance(value, dict), name, f"expected a mapping, got {value!r}")
        key_type, value_type = typing.get_args(typ) or (Any, Any)
        return {coerce(k, key_type, f"{name} key {k!r}"): coerce(v, value_type, f"{name}.{k}")
                for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(typ):
            if option is type(None) and value is None:
                return None
            try:
                return coerce(value, option, name)
            except ConfigError:
                pass
        raise ConfigError(f"{name}: {value!r} matches none of {typ}")
    if typ is Any:
        return value
    if typ is bool:
        check(isinstance(value, bool), name, f"expected true/false, got {value!r}")
        return value
    if typ is int:
        check(isinstance(value, int) and not isinstance(value, bool), name, f"expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, str):  # YAML reads 1e-3 as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{name}: expected a number, got {value!r}") from None
        check(isinstance(value, (int, float)) and not isinstance(value, bool), name,
              f"expected a number, got {value!r}")
        return float(value)
    if typ is str:
        check(isinstance(value, str), name, f"expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(typ):
        check(isinstance(value, dict), name, f"expected a mapping, got {value!r}")
        return apply(typ(), value, name + ".")
    raise ConfigError(f"{name}: unsupported field type {typ}")


def nest(overrides: dict[str, Any]) -> dict[str, Any]:
    """{'model.n_layers': 2} -> {'model': {'n_layers': 2}} (nested dicts pass through)."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]].update(value)
        else:
            node[parts[-1]] = value
    return nested


def apply(obj: Any, values: dict[str, Any], prefix: str, kind: str = "parameter",
          fixed: tuple[str, ...] = ()) -> Any:
    """Returns obj (a dataclass instance) with the fields in `values` replaced, type-checked.

    `kind` names the fields in errors ("parameter", or "section" for Config's); the fields in
    `fixed` cannot be set this way (Config's scale)."""
    cls = type(obj)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in fixed]
    changes = {}
    for key, value in values.items():
        if key not in names:
            raise ConfigError(
                f"unknown {kind} {prefix + key!r}; valid {prefix.rstrip('.') or 'top-level'} "
                f"{kind}s: {', '.join(names)}"
            )
        typ = typing.get_type_hints(cls)[key]
        if dataclasses.is_dataclass(typ):
            check(isinstance(value, dict), prefix + key, f"expected a mapping, got {value!r}")
            changes[key] = apply(getattr(obj, key), value, f"{prefix}{key}.")
        else:
            changes[key] = coerce(value, typ, prefix + key)
    try:
        return dataclasses.replace(obj, **changes)
    except ConfigError:
        raise
    except TypeError as err:  # pragma: no cover - guarded by the name check above
        raise ConfigError(f"{prefix}: {err}") from None
