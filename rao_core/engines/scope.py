"""How long engines live: an EngineScope is opened by whoever runs stages (a flow, one `rao`
command) and holds the vLLM servers its stages start, so every stage inside it shares one server
per engine setting (reloading weights between versions), and every server stops when the scope
ends, however it ends. An engine asked for outside any scope gets a scope of its own that ends
with the engine (one stage, then the server stops).

    with engine_scope(cfg.layout.logs, context=2048):
        ...stages...
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from rao_core.config import VLLMPolicy
from rao_core.engines.vllm_server import VLLMServer

log = logging.getLogger(__name__)


class EngineScope:
    def __init__(self, log_dir: Path | None = None, context: int | None = None) -> None:
        """`log_dir`: where servers write their logs (vllm.log, vllm-judge.log); `context`: tokens
        per sequence every server of the scope holds (the largest any stage of it asks for)."""
        self.log_dir, self.context = log_dir, context
        self.servers: dict[tuple, VLLMServer] = {}
        self.hf_processes: dict[tuple, Any] = {}  # hf_process.EngineProcess per role, device, dtype, replica

    def server(
        self, cfg: VLLMPolicy, max_model_len: int | None, role: str = "policy", lora_rank: int = 0
    ) -> VLLMServer:
        """The scope's server for this role and engine setting (started by its first `ensure`)."""
        length = max(filter(None, (max_model_len, self.context)), default=None)
        key = (role, cfg.vllm_python, cfg.vllm_port, cfg.dtype, cfg.tensor_parallel_size, length,
               tuple(cfg.vllm_extra_args), cfg.vllm_kv_cache_gib, cfg.vllm_during_train, lora_rank)  # fmt: skip
        if key not in self.servers:
            name = "vllm.log" if role == "policy" else f"vllm-{role}.log"
            log_path = self.log_dir / name if self.log_dir is not None else None
            self.servers[key] = VLLMServer(cfg, length, log_path, lora_rank)
        return self.servers[key]

    def release_for_training(self) -> dict[str, str]:
        """Every server sleeps, stops or keeps running (policy.vllm_during_train) while the
        trainer has the device; each wakes at its next `ensure`."""
        done = {role: server.release() for (role, *_), server in self.servers.items()}
        for key, proc in list(self.hf_processes.items()):  # a child's model on the GPU: stop it
            if proc.device != "cpu":
                proc.stop()
                del self.hf_processes[key]
                done[f"hf-{key[0]}"] = "stopped"
        for role, what in done.items():
            if what not in ("none", "kept"):
                log.info("%s engine %s for the train stage", role, what)
        return done

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        for proc in self.hf_processes.values():  # all at once: each takes a moment to exit
            proc.ask_to_stop()
        for proc in self.hf_processes.values():
            proc.wait_stopped()
        self.hf_processes.clear()


_CURRENT: ContextVar[EngineScope | None] = ContextVar("rao_engine_scope", default=None)


@contextlib.contextmanager
def engine_scope(log_dir: Path | None = None, context: int | None = None) -> Iterator[EngineScope]:
    scope = EngineScope(log_dir, context)
    token = _CURRENT.set(scope)
    try:
        yield scope
    finally:
        _CURRENT.reset(token)
        scope.close()


def current_scope() -> EngineScope | None:
    return _CURRENT.get()


@contextlib.contextmanager
def make_room_for_training() -> Iterator[dict[str, str]]:
    """The train stage's scope: the current scope's servers leave the device while it runs."""
    scope = current_scope()
    yield scope.release_for_training() if scope is not None else {}
