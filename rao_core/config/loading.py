"""The configuration's layers: `--set key=value` parsed, YAML-shaped layers merged, the result
validated once by pydantic (sections.py holds the rules) into a RunConfig, with any problem as one
ConfigError line naming the key, the value and the rule. Which layers a run has (the suite's
defaults, a YAML file, the overrides) is rao_core/run.py's `load_config`, above the suites.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from rao_core.config.policy import ENGINES, PolicyConfig
from rao_core.config.sections import RunConfig


class ConfigError(ValueError):
    """Bad configuration: the message is one line naming the key, the value and the rule."""


class ConfigWarning(FutureWarning):
    """A configuration key of an older version, taken as its new one: the message says which
    (the `rao` command prints it as one `warning:` line)."""


# Keys that existed once: a clear word instead of "unknown field".
RETIRED = {
    "train.temperature": "removed: the trainer takes log-probs at the temperature each node was sampled "
    "at (recorded in the nodes table); set policy.temperature",
    "rollout.round": "removed: the round is an argument, not a setting (rao rollout --round N, rao score --round N)",
    "rollout.policy_version": "removed: a round's rows carry the version that sampled them (version N in round N)",
}
# Keys an older run folder's config.yaml holds that are now arguments: dropped when a file is read.
MOVED_TO_ARGUMENTS = {"rollout": ("round", "policy_version")}


def migrate_file(data: dict) -> dict:
    """A configuration file of an older version, as today's (as layout.py migrates an old run
    folder): keys that became arguments dropped. (The built-in suites' settings that moved into
    their suite_args: rao_core/envs/args.py, migrate_suite_settings.)"""
    for section, keys in MOVED_TO_ARGUMENTS.items():
        if isinstance(data.get(section), dict) and any(k in data[section] for k in keys):
            data = {**data, section: {k: v for k, v in data[section].items() if k not in keys}}
    return data


def field_types(cls: type) -> dict[str, Any]:
    """A section's field names and their (resolved) types; `policy` is the PolicyConfig base (its
    engine classes add their own fields)."""
    types = {name: f.annotation for name, f in cls.__pydantic_fields__.items()}
    return {name: PolicyConfig if name == "policy" and cls is RunConfig else t for name, t in types.items()}


SECTIONS = {name for name, t in field_types(RunConfig).items() if dataclasses.is_dataclass(t)}
MAPPINGS = SECTIONS | {"suite_args"}  # merged key by key across the layers
_ADAPTER = TypeAdapter(RunConfig)


def parse_override(text: str) -> dict:
    """'agent.max_depth=3' -> {'agent': {'max_depth': 3}} (the value is read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not YAML: the string itself (the field's rule decides)
    out: dict = {}
    cur = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def merge_layers(layers: list[dict]) -> dict:
    """YAML-shaped layers, later ones winning (see _merge)."""
    merged: dict = {}
    for layer in layers:
        merged = _merge(merged, layer)
    return merged


def _merge(base: dict, layer: dict) -> dict:
    """Section by section; a field's value (a list, a dict) is replaced whole, never merged."""
    out = dict(base)
    for key, value in layer.items():
        if key in MAPPINGS and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


_UNION_TAGS = {"bool", "int", "float", "str", "none", "list", "dict"}


def _field_path(loc: tuple) -> str:
    """('train', 'bf16', 'bool') -> 'train.bf16': keep field names and list indices only
    (pydantic names the engine class of `policy` too: ('policy', 'vllm', 'vllm_port'))."""
    parts: list[str] = []
    node: Any = RunConfig
    for p in loc:
        if node is PolicyConfig and p in ENGINES:
            node = ENGINES[p]
            continue
        types = field_types(node) if node is not None else {}
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in types:
            parts.append(("." if parts else "") + p)
            node = types[p] if dataclasses.is_dataclass(types[p]) else None
        elif node is not None:
            parts.append(("." if parts else "") + str(p))  # an unknown key
            break
        elif p in _UNION_TAGS or "[" in str(p):  # pydantic's name of a union member, not a key
            break
        else:
            parts.append(f".{p}")  # a key inside a dict-valued field
    return "".join(parts)


def one_line(err: ValidationError) -> str:
    """pydantic's first error as `key: value: rule`."""
    e = err.errors(include_url=False)[0]
    key = _field_path(tuple(e["loc"]))
    if e["type"] in ("union_tag_invalid", "union_tag_not_found"):  # policy.kind: the engine is unknown
        tag = e.get("ctx", {}).get("tag", "")
        return f"{key}.kind: {tag!r}: must be one of {', '.join(ENGINES)}"
    if e["type"] == "value_error":  # our own rules already say `key: value: rule`
        msg = str(e.get("ctx", {}).get("error", e["msg"]))
        return msg if not key or msg.startswith(key) else f"{key}: {e['input']!r}: {msg}"
    if e["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        if key in RETIRED:
            return f"{key}: {RETIRED[key]}"
        section = key.rsplit(".", 1)[0] if "." in key else ""
        cls: Any = RunConfig
        for part in filter(None, section.split(".")):
            cls = field_types(cls)[part]
        if cls is PolicyConfig and len(e["loc"]) > 1 and e["loc"][1] in ENGINES:
            kind = e["loc"][1]
            others = [k for k, c in ENGINES.items() if key.split(".")[-1] in c.__pydantic_fields__]
            where = f"; it is a setting of policy.kind {' and '.join(others)}" if others else ""
            known = ", ".join(sorted(ENGINES[kind].__pydantic_fields__))
            return f"{key}: not a setting of the {kind} engine{where} (policy.kind {kind} has: {known})"
        known = ", ".join(sorted(field_types(cls)))
        return f"{key}: unknown field (known: {known})"
    return f"{key}: {e['input']!r}: {e['msg'][0].lower()}{e['msg'][1:]}"


def build(data: dict) -> RunConfig:
    """A RunConfig from one nested dict, or ConfigError."""
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise ConfigError(one_line(e)) from None


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    from rao_core.store.files import write_text

    write_text(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False))
