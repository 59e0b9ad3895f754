"""``DistributedStrategy``: fleet's configuration, every option of Paddle 3.3's with Paddle's
names, types, defaults and merge semantics (the table: ``strategy_options``). Options
ringflow gives no effect are accepted and kept; fleet warns once naming the ones set."""

from __future__ import annotations

import copy
import dataclasses
import json
import numbers
from pathlib import Path
from typing import Any

from ringflow.compiler.build_strategy import DEFAULT_BUILD_STRATEGY, BuildStrategy
from ringflow.distributed import strategy_options as table
from ringflow.distributed.strategy_options import Repeated
from ringflow.errors import ConfigError, ConfigTypeError, ConfigValueError

PROTOTXT_FORMAT = "ringflow.DistributedStrategy/1"


def _defaults(schema: Any) -> Any:
    """The default value of a table entry (messages: dicts of their fields' defaults)."""
    if isinstance(schema, dict):
        return {key: _defaults(value) for key, value in schema.items()}
    return [] if isinstance(schema, Repeated) else schema


def _type_error(where: str, kind: str, value: Any, option: str) -> ConfigError:
    text = f"{where} must be {kind}, got {value!r} ({type(value).__name__})"
    if option in table.PADDLE_RAISES_VALUE_ERROR:
        return ConfigValueError(text)
    return ConfigTypeError(text)


def _scalar(where: str, option: str, default: Any, value: Any) -> Any:
    """``value`` in the type of ``default`` (bool, int, float or str), or a ConfigError."""
    if isinstance(default, bool) or default is bool:
        ok, kind = isinstance(value, bool), "a bool"
    elif isinstance(default, int) or default is int:
        ok, kind = isinstance(value, numbers.Integral) and not isinstance(value, bool), "an int"
    elif isinstance(default, float) or default is float:
        ok, kind = isinstance(value, numbers.Real) and not isinstance(value, bool), "a number"
    else:
        ok, kind = isinstance(value, str), "a str"
    if not ok:
        raise _type_error(where, kind, value, option)
    kind_of = default if isinstance(default, type) else type(default)
    return kind_of(value)


def _checked(where: str, option: str, schema: Any, value: Any, minimum: Any = None) -> Any:
    """The checked value of one option or config field (a message: the fields given)."""
    if isinstance(schema, dict):
        return _checked_message(where, option, schema, value, minimum or {})
    if isinstance(schema, Repeated):
        if not isinstance(value, (list, tuple)):
            raise _type_error(where, f"a list of {_kind(schema.item)}", value, option)
        if isinstance(schema.item, dict):
            return [_merged(_defaults(schema.item), _checked(f"{where}[{i}]", option,
                                                             schema.item, item))
                    for i, item in enumerate(value)]
        try:
            return [_scalar(where, option, schema.item, item) for item in value]
        except ConfigError:
            raise _type_error(where, f"a list of {_kind(schema.item)}", value, option) from None
    checked = _scalar(where, option, schema, value)
    if minimum is not None and checked < minimum:
        raise ConfigValueError(f"{where} must be >= {minimum}, got {value!r}")
    return checked


def _checked_message(where: str, option: str, schema: dict, value: Any,
                     minimum: dict) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _type_error(where, "a dict", value, option)
    for key in value:
        if key not in schema:
            raise ConfigError(f"{where}: unknown key {key!r}; known keys: {', '.join(schema)}")
    checked = {key: _checked(f"{where}[{key!r}]", option, schema[key], item, minimum.get(key))
               for key, item in value.items()}
    for key, item in checked.items():
        choices = table.CHOICES.get((option, key))
        if choices and item not in choices:
            raise ConfigValueError(f"{where}[{key!r}] must be one of {', '.join(choices)}, "
                                   f"got {item!r}")
    return checked


def _kind(item: Any) -> str:
    return "dicts" if isinstance(item, dict) else item.__name__


def _merged(current: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``current`` with the keys of ``given`` assigned (nested messages merged too), as
    Paddle's ``assign_configs_value``: keys not given keep their value."""
    out = dict(current)
    for key, value in given.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) else value
    return out


def _hybrid_extras(configs: Any) -> tuple[Any, dict[str, list[str]]]:
    """A hybrid_configs assignment without ``order`` and ``mp_configs.sync_param_name``
    (which set ``hybrid_parallel_order`` and ``sync_param_name``, as Paddle's setter does),
    and those two attributes' checked values."""
    if not isinstance(configs, dict):
        return configs, {}
    configs, extras = copy.deepcopy(configs), {}
    if "order" in configs:
        order = configs.pop("order")
        if not (isinstance(order, (list, tuple)) and sorted(order) == sorted(set(order))
                and set(order) <= set(table.HYBRID_ORDER)):
            raise ConfigValueError(f"hybrid_configs['order'] must list distinct axes of "
                                   f"{', '.join(table.HYBRID_ORDER)}, got {order!r}")
        extras["hybrid_parallel_order"] = list(order)
    mp = configs.get("mp_configs")
    if isinstance(mp, dict) and "sync_param_name" in mp:
        extras["sync_param_name"] = _checked(
            "hybrid_configs['mp_configs']['sync_param_name']", "hybrid_configs", table.STRS,
            mp.pop("sync_param_name"))
    return configs, extras


def _option_names() -> list[str]:
    return [*table.OPTIONS, *table.FREE_FORM, table.BUILD_STRATEGY]


def _option(name: str) -> property:
    schema = table.OPTIONS[name]
    is_message = isinstance(schema, dict)

    def get(self: DistributedStrategy) -> Any:
        return copy.deepcopy(self._values[name])

    def set(self: DistributedStrategy, value: Any) -> None:
        self._set(name, value)

    doc = f"Paddle's ``{name}`` (default {_defaults(schema)!r})." if not is_message else \
        f"Paddle's ``{name}``: a dict merged into the current one (defaults: " \
        f"``DistributedStrategy().{name}``)."
    return property(get, set, doc=doc)


def _free_form(name: str) -> property:
    def get(self: DistributedStrategy) -> Any:
        return copy.deepcopy(self._values[name])

    def set(self: DistributedStrategy, value: Any) -> None:
        if not isinstance(value, dict):
            raise ConfigTypeError(f"{name} must be a dict, got {value!r} "
                                  f"({type(value).__name__})")
        self._values[name] = copy.deepcopy(value) or []
        self._non_auto_set = True

    return property(get, set, doc=f"Parameter-server tables (``{name}``): kept, no effect.")


class DistributedStrategy:
    """What fleet should do to the user's program (``paddle.distributed.fleet.
    DistributedStrategy``): all of Paddle 3.3's 59 options with its types and defaults.

    A ``*_configs`` getter returns a new dict of ALL its fields; its setter merges: only the
    keys given change (``{}`` changes nothing; nested messages merge too). Unknown keys and
    ill-typed values are ConfigErrors and change nothing. Stricter than Paddle on purpose: where
    Paddle logs and keeps the old value (``strategy.amp = "True"``) ringflow raises a
    ConfigError naming option and value (a ConfigTypeError, also a TypeError); where Paddle
    raises TypeError or ValueError, the ConfigError is also one. Lists in configs are
    replaced, not appended to as Paddle's protobuf ``extend`` does. Setting an attribute that
    is not an option is a ConfigTypeError (Paddle: TypeError).

    ``hybrid_configs["order"]`` sets ``hybrid_parallel_order`` and
    ``hybrid_configs["mp_configs"]["sync_param_name"]`` sets ``sync_param_name``, as Paddle's.
    ``build_strategy`` takes ringflow's ``BuildStrategy``. ``save_to_prototxt`` writes every
    option as JSON (see ``save_to_prototxt``)."""

    def __init__(self) -> None:
        # Straight into __dict__: __setattr__ only lets options be assigned.
        self.__dict__.update(
            _values={name: _defaults(schema) for name, schema in table.OPTIONS.items()}
            | {name: [] for name in table.FREE_FORM},
            _build_strategy=DEFAULT_BUILD_STRATEGY,
            _non_auto_set=False,  # per instance; Paddle keeps one module-global flag
            _assigned=set(),      # options a setter was called for (not by loading a file)
            _given={name: set() for name, s in table.OPTIONS.items() if isinstance(s, dict)},
            hybrid_parallel_order=list(table.HYBRID_ORDER),
            sync_param_name=list(table.SYNC_PARAM_NAME),
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if not hasattr(type(self), name) and name not in self.__dict__:
            raise ConfigTypeError(f"DistributedStrategy has no option {name!r}; options: "
                                  f"{', '.join(_option_names())}")
        object.__setattr__(self, name, value)

    # -- setting ------------------------------------------------------------------------
    def _set(self, name: str, value: Any) -> None:
        extras: dict[str, list[str]] = {}
        if name == "hybrid_configs":
            value, extras = _hybrid_extras(value)
        checked = self._checked(name, value)
        self.__dict__.update(extras)   # only once the whole assignment is valid
        if isinstance(checked, dict):
            self._values[name] = _merged(self._values[name], checked)
            self._given[name].update(checked)
        else:
            self._values[name] = checked
        self._assigned.add(name)
        if name == "a_sync":   # as Paddle's setter
            self._values["a_sync_configs"]["k_steps"] = 0
        if name != "auto":
            self._non_auto_set = True

    @staticmethod
    def _checked(name: str, value: Any) -> Any:
        schema = table.OPTIONS[name]
        minimum = table.MINIMUM.get(name) if isinstance(schema, dict) \
            else table.MINIMUM[""].get(name)
        checked = _checked(name, name, schema, value, minimum)
        if name == "last_comm_group_size_MB" and checked <= 0:
            raise ConfigValueError(f"last_comm_group_size_MB must be > 0, got {value!r}")
        return checked

    @property
    def build_strategy(self) -> BuildStrategy:
        """ringflow's ``BuildStrategy`` the executor prepares fleet's programs with (Paddle's
        ``paddle.static.BuildStrategy``): fleet attaches it to the main program."""
        return self._build_strategy

    @build_strategy.setter
    def build_strategy(self, strategy: Any) -> None:
        if not isinstance(strategy, BuildStrategy):
            raise ConfigTypeError(f"build_strategy must be a ringflow BuildStrategy, got "
                                  f"{strategy!r} ({type(strategy).__name__})")
        self.__dict__["_build_strategy"] = strategy
        self._non_auto_set = True

    # -- reading ------------------------------------------------------------------------
    def _was_given(self, option: str, key: str) -> bool:
        """Whether ``<option>[key]`` was ever assigned (a default that ringflow derives,
        such as the sharding degree, applies only while it was not)."""
        return key in self._given[option]

    def _mp_degree(self) -> int | None:
        """The tensor-parallel degree the strategy asks for (``tensor_parallel``,
        ``hybrid_configs["mp_degree"]`` or Paddle's older hybrid form
        ``sharding_configs["mp_degree"]``), None when it asks none."""
        if self.tensor_parallel:
            return int(self._values["tensor_parallel_configs"]["tensor_parallel_degree"])
        if self._given["hybrid_configs"]:
            return int(self._values["hybrid_configs"]["mp_degree"])
        if self.sharding and self._was_given("sharding_configs", "mp_degree"):
            return int(self._values["sharding_configs"]["mp_degree"])
        return None

    def _effective_build_strategy(self) -> BuildStrategy:
        """``build_strategy`` with this strategy's ``fuse_all_reduce_ops`` and
        ``fuse_grad_size_in_MB`` where they differ from their defaults."""
        changes: dict[str, Any] = {}
        if self.fuse_all_reduce_ops is not table.OPTIONS["fuse_all_reduce_ops"]:
            changes["fuse_all_reduce_ops"] = self.fuse_all_reduce_ops
        if self.fuse_grad_size_in_MB != table.OPTIONS["fuse_grad_size_in_MB"]:
            changes["fuse_grad_size_in_MB"] = float(self.fuse_grad_size_in_MB)
        return dataclasses.replace(self._build_strategy, **changes)

    def _is_strict_auto(self) -> bool:
        """True when ``auto`` is on and no other option was ever set (Paddle's rule)."""
        return self.auto and not self._non_auto_set

    def _changed(self) -> dict[str, Any]:
        """option -> value, for the options whose value is not the default."""
        defaults = DistributedStrategy()
        changed = {name: value for name, value in self._values.items()
                   if value != defaults._values[name]}
        if self._build_strategy != DEFAULT_BUILD_STRATEGY:
            changed[table.BUILD_STRATEGY] = self._build_strategy
        return changed

    def _set_without_effect(self) -> list[str]:
        """The options set to a value other than their default that ringflow gives no
        effect (fleet names them in one warning)."""
        return [name for name in self._changed() if name not in table.EFFECTIVE]

    def _settings(self) -> list[str]:
        """One ``name = value`` per option that differs from its default; an enabled
        feature shows all its configs, other configs the fields that differ."""
        changed = self._changed()
        lines = []
        for name, value in changed.items():
            feature = name.removesuffix("_configs")
            if name in table.OPTIONS and isinstance(value, dict) \
                    and self._values.get(feature) is not True:
                lines += [f"{name}.{key} = {item!r}" for key, item in
                          _flat_diff(value, _defaults(table.OPTIONS[name]))]
            else:
                lines.append(f"{name} = {value!r}")
        for feature in changed:
            if changed[feature] is True and f"{feature}_configs" in self._values and \
                    f"{feature}_configs" not in changed:
                lines.append(f"{feature}_configs = {self._values[f'{feature}_configs']!r}")
        if self.hybrid_parallel_order != table.HYBRID_ORDER:
            lines.append(f"hybrid_parallel_order = {self.hybrid_parallel_order!r}")
        if self.sync_param_name != table.SYNC_PARAM_NAME:
            lines.append(f"sync_param_name = {self.sync_param_name!r}")
        return lines

    def __str__(self) -> str:
        settings = self._settings()
        if not settings:
            return "DistributedStrategy: all defaults"
        return "\n  ".join(["DistributedStrategy:", *settings])

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DistributedStrategy):
            return NotImplemented
        return self._state() == other._state()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def _state(self) -> tuple:
        return (self._values, self._build_strategy, self.hybrid_parallel_order,
                self.sync_param_name)

    # -- files --------------------------------------------------------------------------
    def save_to_prototxt(self, output: str | Path) -> None:
        """Write every option to ``output``: JSON ``{"format": "ringflow.DistributedStrategy
        /1", "options": {name: value}, "hybrid_parallel_order": [...], "sync_param_name":
        [...]}``, ``build_strategy`` as a dict of its fields (not Paddle's protobuf text)."""
        options = copy.deepcopy(self._values)
        options[table.BUILD_STRATEGY] = self._build_strategy.as_dict()
        document = {"format": PROTOTXT_FORMAT, "options": options,
                    "hybrid_parallel_order": self.hybrid_parallel_order,
                    "sync_param_name": self.sync_param_name}
        Path(output).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")

    def load_from_prototxt(self, pb_file: str | Path) -> None:
        """Merge the options of a file ``save_to_prototxt`` wrote into this strategy, each
        checked as its setter checks it (the options the file names are assigned, as
        Paddle's text-format merge does). Nothing changes unless every option is valid."""
        try:
            document = json.loads(Path(pb_file).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"load_from_prototxt({str(pb_file)!r}): {exc}") from None
        if not isinstance(document, dict) or document.get("format") != PROTOTXT_FORMAT:
            raise ConfigError(f"load_from_prototxt({str(pb_file)!r}): not a strategy file "
                              f"of format {PROTOTXT_FORMAT!r}")
        loaded = copy.deepcopy(self)
        for name, value in dict(document.get("options", {})).items():
            if name == table.BUILD_STRATEGY:
                loaded.__dict__["_build_strategy"] = BuildStrategy.from_dict(value)
            elif name in table.FREE_FORM:
                loaded._values[name] = copy.deepcopy(value)
            elif name in table.OPTIONS:
                checked = self._checked(name, value)
                loaded._values[name] = _merged(loaded._values[name], checked) \
                    if isinstance(checked, dict) else checked
            else:
                raise ConfigError(f"load_from_prototxt({str(pb_file)!r}): unknown option "
                                  f"{name!r}")
        for name in ("hybrid_parallel_order", "sync_param_name"):
            if name in document:
                loaded.__dict__[name] = _checked(name, name, table.STRS, document[name])
        self.__dict__.update(_values=loaded._values, _build_strategy=loaded._build_strategy,
                             hybrid_parallel_order=loaded.hybrid_parallel_order,
                             sync_param_name=loaded.sync_param_name)


def _flat_diff(value: dict, default: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) for each field of a message that differs from its default."""
    out = []
    for key, item in value.items():
        if isinstance(item, dict):
            out += _flat_diff(item, default[key], f"{prefix}{key}.")
        elif item != default[key]:
            out.append((prefix + key, item))
    return out


for _name in table.OPTIONS:
    setattr(DistributedStrategy, _name, _option(_name))
for _name in table.FREE_FORM:
    setattr(DistributedStrategy, _name, _free_form(_name))
del _name
