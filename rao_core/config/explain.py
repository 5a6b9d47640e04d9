"""The configuration described from its own fields: every key with its default, its rule and its
help (`rao config --explain [section|key]`), and whether a run folder may resume with another value
of it (the `resume` rule each field declares in sections.py)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from typing import Any

from pydantic.fields import FieldInfo

from rao_core.config.policy import ENGINES, PolicyConfig
from rao_core.config.sections import RunConfig


@dataclasses.dataclass
class Key:
    name: str  # section.field
    info: FieldInfo
    engines: tuple[str, ...] = ()  # for policy.*: the engines (policy.kind) that have it

    @property
    def free(self) -> bool:
        return (self.info.json_schema_extra or {}).get("resume") == "free"


def keys(suite_args_model: Any = None) -> Iterator[Key]:
    """Every key of the configuration, sections in order; policy.* once per setting, with its
    engines (the shared ones as PolicyConfig has them: policy.kind defaults to hf); with the active
    suite's `Args` model, its suite_args.* too."""
    for name, info in RunConfig.__pydantic_fields__.items():
        if name == "policy":
            shared = PolicyConfig.__pydantic_fields__
            yield from (Key(f"policy.{field}", finfo) for field, finfo in shared.items())
            seen: dict[str, Key] = {}
            for kind, cls in ENGINES.items():
                for field, finfo in cls.__pydantic_fields__.items():
                    if field not in shared:
                        seen.setdefault(field, Key(f"policy.{field}", finfo)).engines += (kind,)
            yield from seen.values()
        elif name == "suite_args" and suite_args_model is not None:
            for field, finfo in suite_args_model.model_fields.items():
                yield Key(f"suite_args.{field}", finfo)
        elif dataclasses.is_dataclass(info.annotation):
            for field, finfo in info.annotation.__pydantic_fields__.items():
                yield Key(f"{name}.{field}", finfo)
        else:
            yield Key(name, info)


def find(name: str) -> Key | None:
    return next((k for k in keys() if k.name == name), None)


def is_free(name: str) -> bool:
    """May a run folder go on with another value of this key? (Unknown keys: no.)"""
    key = find(name)
    return key is not None and key.free


def default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()
    return info.default


def rule(info: FieldInfo) -> str:
    """The field's type and constraints in words: `int >= 1`, `one of cpu, cuda, auto`."""
    ann = info.annotation
    while typing.get_origin(ann) is typing.Annotated:
        ann = typing.get_args(ann)[0]
    if typing.get_origin(ann) is typing.Literal:
        text = "one of " + ", ".join(map(str, typing.get_args(ann)))
    elif typing.get_origin(ann) in (list, dict):
        text = str(ann).replace("typing.", "")
    else:
        text = getattr(ann, "__name__", str(ann)).replace("typing.", "")
    names = {
        "ge": ">=",
        "gt": ">",
        "le": "<=",
        "lt": "<",
        "min_length": "length >=",
        "max_length": "length <=",
    }
    for meta in info.metadata:
        for attr, sign in names.items():
            if getattr(meta, attr, None) is not None:
                text += f" {sign} {getattr(meta, attr)}"
    return text


def explain(query: str | None = None, suite_args_model: Any = None) -> str:
    """The keys under `query` (a section like `train`, or one key like `train.lr`; all of them
    without one), each with its default, rule, help and resume rule; suite_args.* are those of
    `suite_args_model`, the active suite's `Args`."""
    every = list(keys(suite_args_model))
    found = [k for k in every if not query or k.name == query or k.name.startswith(f"{query}.")]
    if not found:
        sections = sorted({k.name.split(".")[0] for k in every})
        raise KeyError(f"{query!r}: no such key or section (sections: {', '.join(sections)})")
    lines = []
    for k in found:
        engines = f" [policy.kind {', '.join(k.engines)}]" if k.engines else ""
        resume = "may change on resume" if k.free else "fixed once a round is done"
        lines.append(f"{k.name}{engines} = {default(k.info)!r}  ({rule(k.info)}; {resume})")
        lines.append(f"    {k.info.description}")
    return "\n".join(lines)
