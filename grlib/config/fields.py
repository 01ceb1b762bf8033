"""Typed fields: ConfigError, the one-line field check, each field's domain (a Rule in its
metadata), and applying a mapping of YAML / JSON values to a frozen dataclass with every value
checked (and losslessly converted) against its declared type.

    n_layers: int = param(1, at_least(1))                     # a field and its domain, declared together
    check_fields(self, "model.")                              # in __post_init__: every field against its rule
    apply(ModelConfig(), {"n_layers": 2}, "model.")           # -> ModelConfig(n_layers=2, ...)
    apply(ModelConfig(), {"n_layer": 2}, "model.")            # ConfigError: unknown parameter 'model.n_layer'; ...
    nest({"model.n_layers": 2})                               # -> {"model": {"n_layers": 2}}
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass
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


@dataclass(frozen=True)
class Rule:
    """A field's domain: `ok(value)` says whether a value lies in it, `text` states it ("must be
    >= 1"), `bad` holds values outside it (tests/test_config_domains.py sets every field to each
    of them and expects one error line naming the field, the value and the rule)."""

    text: str
    ok: Callable[[Any], bool]
    bad: tuple[Any, ...] = ()
    why: Callable[[Any], str] | None = None  # the error of a value outside (default: "<text>, got <value>")

    def holds(self, value: Any) -> bool:
        try:
            return bool(self.ok(value))
        except (TypeError, ValueError):  # a value of another type (a dataclass built directly)
            return False

    def error(self, value: Any) -> str:
        return self.why(value) if self.why else f"{self.text}, got {value!r}"


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def at_least(n: int) -> Rule:
    """An integer >= n (counts, sizes, lengths, steps)."""
    return Rule(f"must be >= {n}", lambda v: _int(v) and v >= n, (n - 1, n - 1000))


def above(x: float) -> Rule:
    """A finite number > x (rates, temperatures, time limits)."""
    return Rule(f"must be > {x:g} and finite", lambda v: _real(v) and v > x,
                (float(x), x - 1.0, float("nan"), float("inf")))


def not_below(x: float) -> Rule:
    """A finite number >= x (weight decay, gradient clip)."""
    return Rule(f"must be >= {x:g} and finite", lambda v: _real(v) and v >= x,
                (x - 1e-3, x - 1.0, float("nan"), float("-inf")))


def real() -> Rule:
    """Any finite number (a fitted coefficient)."""
    return Rule("must be a finite number", _real, (float("nan"), float("inf")))


def fraction() -> Rule:
    """A probability in [0, 1)."""
    return Rule("must be in [0, 1)", lambda v: _real(v) and 0.0 <= v < 1.0, (-0.1, 1.0, 1.5, float("nan")))


def seed() -> Rule:
    """A random seed: an integer in [0, 2**32) (numpy's generators refuse negative ones)."""
    return Rule("must be in [0, 2**32)", lambda v: _int(v) and 0 <= v < 2**32, (-1, 2**32))


def choice(valid: tuple[Any, ...], prefix: str = "") -> Rule:
    """One of a choice list (grlib.config.choices); `prefix` leads its error (e.g. "data.dataset: ")."""
    bad = (max(valid) + 1, min(valid) - 1) if all(_int(v) for v in valid) else ("no-such-choice",)
    return Rule(f"must be one of {valid}", lambda v: v in valid, bad, lambda v: f"{prefix}{v!r} is not one of {valid}")


def each(rule: Rule, min_len: int = 1) -> Rule:
    """A list of at least min_len values, each in `rule`'s domain."""
    def why(v: Any) -> str:
        if not isinstance(v, (list, tuple)) or len(v) < min_len:
            return f"needs at least {min_len} value{'s' * (min_len != 1)}, got {v!r}"
        first = next(x for x in v if not rule.holds(x))
        return f"{rule.error(first)} (in {list(v)!r})"

    return Rule(f"needs at least {min_len} value{'s' * (min_len != 1)}, each of which {rule.text}",
                lambda v: isinstance(v, (list, tuple)) and len(v) >= min_len and all(rule.holds(x) for x in v),
                tuple([b] for b in rule.bad) + (([],) if min_len else ()), why)


FLAG = Rule("must be true or false", lambda v: isinstance(v, bool))
# a field checked as a whole by its section's __post_init__ (per-dataset overrides: keys and values)
CHECKED_BY_SECTION = Rule("is checked by its section", lambda v: True)


def param(default: Any = MISSING, rule: Rule | None = None, *, factory: Any = MISSING) -> Any:
    """A dataclass field with its domain: `n_layers: int = param(1, at_least(1))`; lists take
    `factory`: `param(rule=each(at_least(2)), factory=lambda: [256])`."""
    if rule is None:
        raise TypeError("param(): every field declares its rule")
    return dataclasses.field(default=default, default_factory=factory, metadata={"rule": rule})


def rule_of(f: dataclasses.Field) -> Rule | None:
    """The rule a field declared with param(), None for a field declared without one."""
    return f.metadata.get("rule")


def check_fields(obj: Any, prefix: str) -> None:
    """Raises ConfigError '<prefix><field>: <rule>, got <value>' for the first field of `obj` (a
    dataclass whose fields are declared with param()) outside its domain."""
    for f in dataclasses.fields(obj):
        rule = rule_of(f)
        if rule is None:
            raise TypeError(f"{type(obj).__name__}.{f.name} declares no rule (grlib.config.fields.param)")
        value = getattr(obj, f.name)
        if not rule.holds(value):
            raise ConfigError(f"{prefix}{f.name}: {rule.error(value)}")


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
