"""The building blocks of the configuration's fields: `opt(default, help, **rule)` and the value
types (strict ints, numbers that are not booleans, comma lists checked item by item)."""

from __future__ import annotations

import re
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, StrictInt
from pydantic.dataclasses import dataclass

STRICT = ConfigDict(extra="forbid", validate_assignment=True)


def opt(default: Any, help: str, resume: str = "fixed", **rule: Any) -> Any:
    """A field with its default, its help string and its validation rule (pydantic's ge, gt,
    min_length, ...). `resume="free"`: a run folder may go on with another value of this field (it
    changes only what has not run yet: scheduling, placement, tracking); "fixed" fields must keep
    the value the run's completed stages were made with (rao_core/resume.py)."""
    extra = {"resume": resume}
    if isinstance(default, list | dict):
        return Field(
            default_factory=lambda: type(default)(default), description=help, json_schema_extra=extra, **rule
        )
    return Field(default, description=help, json_schema_extra=extra, **rule)


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


def _yaml_off(value: Any) -> Any:
    """YAML 1.1 (`--set`, config files) reads `off` as False: for a setting whose word is "off",
    that is what the user typed."""
    return "off" if value is False else value


YamlOff = BeforeValidator(_yaml_off)


def _as_list(value: Any) -> Any:
    """`a,b`, [a, b] and a single a (YAML may read it as an int) all mean the same list."""
    if isinstance(value, list | tuple):
        return [str(v).strip() for v in value]
    if isinstance(value, int | str) and not isinstance(value, bool):
        return [p.strip() for p in str(value).split(",") if p.strip()]
    return value


def _as_values(value: Any) -> Any:
    """`1,2`, [1, 2] and a single 1 all mean the same list of numbers (each part read as YAML)."""
    if isinstance(value, str):
        return [yaml.safe_load(p) for p in value.split(",") if p.strip()]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [value]
    return value


def _items_in(allowed: tuple[str, ...]):
    def check(items: list[str]) -> list[str]:
        bad = [p for p in items if p not in allowed]
        if not items or bad:
            raise ValueError(f"must be a list of {', '.join(allowed)} (got {bad or 'nothing'})")
        return items

    return check


def _non_empty(items: list[str]) -> list[str]:
    if not items:
        raise ValueError("must be a non-empty list")
    return items


def _ints_at_least(low: int):
    def check(items: list[int]) -> list[int]:
        bad = [p for p in items if p < low]
        if bad:
            raise ValueError(f"every entry must be an int >= {low} (got {bad})")
        return items

    return check


def _device(value: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", value):
        raise ValueError("expected auto, cpu, cuda or cuda:N (the GPU of index N)")
    return value


def device_type(device: str) -> str:
    """'cuda:1' -> 'cuda'; 'cpu', 'auto' as they are."""
    return device.split(":")[0]


Int = StrictInt  # YAML gives ints; a bool or a string is a mistake, not an int
Float = Annotated[float, BeforeValidator(_no_bool)]
# A device: auto, cpu, cuda, or cuda:N, so that the engines and the trainer can sit on different GPUs.
Device = Annotated[str, AfterValidator(_device)]
# Lists are lists (YAML `[medium, hard]`), and `medium,hard` on the command line means the same.
# Difficulty labels are the suite's (rao_core/envs/registry.py checks them against it).
Difficulties = Annotated[list[str], BeforeValidator(_as_list), AfterValidator(_non_empty)]
Labels = Annotated[list[str], BeforeValidator(_as_list)]  # may be empty
NumberList = BeforeValidator(_as_values)  # Annotated[list[int], NumberList]: `2,3` on the command line
Modes = Annotated[list[str], BeforeValidator(_as_list), AfterValidator(_items_in(("single", "recursive")))]
ContextLimits = Annotated[list[int], BeforeValidator(_as_list), AfterValidator(_ints_at_least(256))]
Fraction = Annotated[Float, Field(gt=0, lt=1)]
section = dataclass(config=STRICT)
