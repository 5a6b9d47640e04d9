"""The run configuration: dataclasses with every default in one place and a help string per field.

Load with `load_config(path, overrides=["agent.max_depth=3", ...])`. Bad input raises ConfigError
with a one-line message naming the field, before any work starts.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    pass


def opt(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class WorldConfig:
    """TextCraft-Synth world generator (reference: seed 42, 5 domains, tiers 0..12, 25 items)."""

    seed: int = opt(42, "seed of the world generator")
    domains: int = opt(5, "number of material domains (at most 5)")
    max_tier: int = opt(12, "highest tier; tier 0 holds base materials")
    items_per_tier: int = opt(25, "items per domain at tier 0; higher tiers hold fewer")
    cross_domain_items: int = opt(6, "items at tiers >= 10 that combine several domains")


@dataclass
class TaskConfig:
    """Task synthesis over a world."""

    seed: int = opt(0, "seed of task sampling (inventories, counts, split)")
    tasks_per_item: int = opt(2, "tasks generated per target item")
    max_count: int = opt(2, "copies of the target to craft: 1..max_count")
    val_fraction: float = opt(0.2, "fraction of items per tier held out for validation")
    buffer_max: float = opt(0.5, "base materials get a random 0..buffer_max extra")
    distractors: list = opt([1, 3], "min and max distractor base items in the inventory")
    small_tasks_per_difficulty: int = opt(
        300, "textcraft-small: tasks per difficulty and split, one world each"
    )


@dataclass
class DeepDiveConfig:
    """DeepDive-style deep search: a seeded knowledge graph rendered as a local web corpus, BM25
    search over it, and multi-hop questions (hops 1..4 = easy..extreme) with exact answers."""

    seed: int = opt(0, "seed of the graph, the corpus and the questions")
    people: int = opt(240, "person entities")
    organisations: int = opt(90, "organisation entities")
    places: int = opt(70, "place entities")
    works: int = opt(160, "work entities (novels, films, albums, plays)")
    near_duplicates: float = opt(0.15, "share of entities that get a near-namesake distractor page")
    questions_per_difficulty: int = opt(120, "questions generated per hop count (difficulty)")
    val_fraction: float = opt(0.2, "share of start entities held out for validation")
    max_results: int = opt(5, "search_web: default number of results")
    page_chars: int = opt(3000, "view_webpage_content: characters returned per call")
    backend: str = opt("bm25", "search backend: bm25 (local corpus) or 'module:factory' (real backend)")
    real_path: str = opt("", "real DeepDive data (parquet/jsonl/json file or folder); empty: synthetic")
    real_split: str = opt("qa_rl", "split of the real dataset folder to read (qa_rl or qa_sft)")


@dataclass
class OolongConfig:
    """Oolong-style long-context aggregation: seeded tabletop-RPG session transcripts with exact
    answers (or the real oolong-real rows), held in the REPL variable `context`, never in the prompt."""

    seed: int = opt(0, "seed of transcripts and questions")
    tasks_per_difficulty: int = opt(16, "synthetic tasks per difficulty and split, spread over its buckets")
    difficulty_tokens: dict = opt(
        {"easy": [2048, 4096], "medium": [8192, 16384], "hard": [32768], "extreme": [65536]},
        "transcript length buckets (approximate tokens) of each difficulty",
    )
    chars_per_token: float = opt(4.0, "characters per token that size the buckets (English BPE: ~4)")
    speakers: int = opt(4, "player characters per transcript (2..12; the DM speaks too)")
    chunk_chars: int = opt(32000, "scripted expert: characters per chunk it reads or delegates")
    real_path: str = opt(
        "", "local oolong-real (dnd) .jsonl/.json/.parquet file or folder: its rows become the val split"
    )


@dataclass
class AgentConfig:
    """The recursive agent and its budgets; all are enforced by the runtime."""

    mode: Literal["recursive", "single"] = opt("recursive", "single removes launch_subagent")
    max_depth: int = opt(6, "depth cap (root = 0); launches past it are refused")
    max_steps: int = opt(40, "model turns per node")
    max_children: int = opt(8, "sub-agents one node may start")
    max_nodes: int = opt(64, "nodes per tree, root included")
    max_context_tokens: int = opt(2048, "tokens per node; overflow ends the node as failed")
    max_new_tokens: int = opt(32, "tokens sampled per turn")
    cell_timeout_s: float = opt(10.0, "wall-clock limit of one cell")
    tree_timeout_s: float = opt(600.0, "wall-clock limit of one tree")
    loop_guard: int = opt(4, "end a node that sends the same cell this many times in a row")
    max_observation_chars: int = opt(2000, "cell output beyond this is truncated")
    max_calls_per_cell: int = opt(200, "tool and launch calls one cell may make")
    reply_format: str = opt("python", "reply format: thought_python (reference), python (terse), markdown")


@dataclass
class SandboxConfig:
    """Limits of the REPL worker processes that run model-written cells."""

    memory_mb: int = opt(1024, "address-space limit of a worker (RLIMIT_AS)")
    cpu_seconds: int = opt(120, "CPU-time limit of a worker over its life (RLIMIT_CPU)")
    seccomp: bool = opt(True, "install the seccomp filter (no files, network, processes)")
    max_output_chars: int = opt(100_000, "stdout a cell may produce before it is cut")


@dataclass
class PolicyConfig:
    """Which policy writes the cells, and how it samples."""

    kind: Literal["scripted", "hf", "vllm", "openai"] = opt("hf", "scripted expert or a model engine")
    model: str = opt(
        "small-warmstart",
        "a checkpoint shipped in rao_core/models/checkpoints, 'warmstart' (train one in this run), "
        "'tiny' (untrained bootstrap model) or a local Hugging Face folder",
    )
    tokenizer: str = opt("tiny", "'tiny' builds the bootstrap tokenizer; else a local HF folder")
    temperature: float = opt(1.0, "sampling temperature of rollouts (0 = greedy)")
    error_rate: float = opt(0.1, "scripted expert: chance per turn of a plausible mistake")
    latency_s: float = opt(0.0, "scripted expert: artificial delay per turn (benchmarks)")
    device: str = opt("auto", "hf engine: cpu, cuda or auto")
    dtype: str = opt("auto", "hf/vllm: float32, bfloat16 or auto (bf16 on GPU, fp32 on CPU)")
    max_batch_size: int = opt(64, "hf engine: sequences per micro-batch")
    max_batch_tokens: int = opt(65536, "hf engine: prompt+new tokens per micro-batch")
    base_url: str = opt("", "openai engine: server URL, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = opt("OPENAI_API_KEY", "openai engine: environment variable holding the key")
    served_model: str = opt("", "openai engine: model name on the server")
    tensor_parallel_size: int = opt(1, "vllm: GPUs per engine replica")
    gpu_memory_utilization: float = opt(0.85, "vllm: fraction of GPU memory for the engine")


@dataclass
class JudgeConfig:
    """The judge of nodes without an exact verifier (Oolong and DeepDive sub-agents): docs/judges.md."""

    kind: Literal["none", "scripted", "hf", "vllm", "openai"] = opt(
        "none",
        "none: judged nodes copy the root's success (root_proxy); scripted: deterministic rule "
        "(tests, scripted runs); hf, vllm, openai: a model judge with the rubric",
    )
    model: str = opt(
        "", "hf/vllm: 'tiny' or a local HF folder; openai: local tokenizer folder ('tiny') framing the prompt"
    )
    base_url: str = opt("", "openai: server URL, e.g. http://127.0.0.1:8001/v1")
    served_model: str = opt("", "openai: model name on the server (default: model)")
    api_key_env: str = opt("OPENAI_API_KEY", "openai: environment variable holding the key")
    temperature: float = opt(0.0, "judge sampling temperature (0 = greedy, reproducible verdicts)")
    max_new_tokens: int = opt(256, "tokens the judge may write per verdict")
    gpu_memory_utilization: float = opt(0.3, "vllm: GPU memory fraction of the judge's own engine")
    cache: bool = opt(True, "reuse verdicts by (rubric, model, goal, answer, reference); <run>/judge_cache/")


@dataclass
class RolloutConfig:
    split: Literal["train", "val"] = opt("train", "which tasks to roll out")
    difficulty: str = opt("hard", "easy, medium, hard, extreme, or a comma list")
    num_tasks: int = opt(16, "root tasks N")
    group_size: int = opt(6, "trees per root task G")
    max_concurrent_trees: int = opt(16, "trees in flight at once")
    round: int = opt(0, "round (iteration) the rows belong to")
    policy_version: int = opt(0, "policy version recorded with the rows")
    shards: int = opt(
        1, "root tasks are dealt into this many shards, each with its own engine replica and partition"
    )
    runner: Literal["local", "ray"] = opt(
        "local", "local: shards one after another in this process; ray: in parallel as Ray tasks"
    )
    ray_address: str = opt(
        "", "runner ray: '' starts a local Ray instance; 'auto' or ray://host:10001 joins one"
    )
    num_cpus_per_shard: float = opt(1.0, "runner ray: CPUs reserved per shard (its trees and REPL workers)")
    num_gpus_per_shard: float = opt(
        0.0, "runner ray: GPUs reserved per shard (policy.tensor_parallel_size for vllm, 1 for hf on GPU)"
    )


@dataclass
class ScoringConfig:
    """RAO's training signal (Eq. 1, 3, 4) and the choices the reference leaves open."""

    lam: float = opt(0.0, "lambda of Eq. 1: weight of the children's mean success")
    depth_weighting: bool = opt(True, "Eq. 4 depth balancing; False gives w = 1")
    unfinished_roots: Literal["keep", "drop"] = opt("keep", "trees whose root never finished")
    single_tree_groups: Literal["skip", "zero_baseline"] = opt("skip", "groups with one valid tree")
    zero_advantage_groups: Literal["skip", "keep"] = opt("skip", "groups whose advantages are all 0")


@dataclass
class TrainConfig:
    """The training stage. Reference (Qwen3-4B): AdamW lr 3e-6, betas (0.9, 0.95), wd 0.017, clip 1.0, bf16."""

    loss_type: Literal["cispo", "grpo", "dr_grpo", "dapo", "bnpo", "sapo", "luspo", "vespo"] = opt(
        "cispo", "TRL loss; cispo = -(sg(clip(ratio, 0, clip_high)) * A * log pi), token mean (the reference)"
    )
    lr: float = opt(1.5e-4, "AdamW learning rate, constant (the tiny model; the paper uses 3e-6 for 4B)")
    betas: list = opt([0.9, 0.95], "AdamW betas")
    weight_decay: float = opt(0.017, "AdamW weight decay")
    max_grad_norm: float = opt(1.0, "gradient clipping by global norm; 0 disables it")
    clip_high: float = opt(
        5.0, "cispo: cap of the importance ratio (TRL epsilon_high); others: upper epsilon"
    )
    clip_low: float = opt(0.2, "grpo-family losses: lower clip epsilon (TRL epsilon); unused by cispo")
    beta: float = opt(0.0, "KL coefficient (TRL beta); 0 loads no reference model (the reference)")
    temperature: float = opt(1.0, "sampling temperature of the rollouts: log-probs are taken at it")
    bf16: bool | None = opt(None, "bf16 autocast over fp32 weights; None = on CUDA only")
    gradient_checkpointing: bool = opt(False, "recompute activations in backward (long contexts)")
    lora: bool = opt(False, "train a LoRA adapter (needs peft), merged into the saved checkpoint")
    lora_r: int = opt(16, "LoRA rank")
    lora_alpha: int = opt(32, "LoRA alpha")
    lora_dropout: float = opt(0.0, "LoRA dropout (0 keeps sampler and trainer log-probs comparable)")
    lora_targets: list = opt(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "LoRA target modules"
    )
    max_tokens_per_microbatch: int = opt(16384, "padded tokens (rows x longest row) per forward/backward")
    keep_optimizer_state: bool = opt(
        True, "carry AdamW's moments from round to round (optimizer.pt in each checkpoint: 2x the weights)"
    )
    steps_per_round: int = opt(4, "optimiser steps per round: the batch is dealt into this many mini-batches")
    seed: int = opt(0, "seed of mini-batch dealing and of torch")
    device: str = opt("auto", "cpu, cuda or auto")
    accelerate_config: str = opt(
        "",
        "accelerate config file (configs/accelerate/*.yaml): the train stage then runs as its own "
        "`accelerate launch` on N processes (DDP/FSDP/ZeRO-3); empty = in the flow's process",
    )


@dataclass
class EvalConfig:
    """Held-out evaluation after each round (greedy by default, one tree per task)."""

    num_tasks: int = opt(32, "validation tasks per difficulty")
    difficulty: str = opt("medium,hard", "difficulties evaluated (comma list)")
    temperature: float = opt(0.0, "sampling temperature of evaluation (0 = greedy)")
    samples: int = opt(1, "trees per held-out task; > 1 needs temperature > 0 (success = mean over them)")
    modes: str = opt("single,recursive", "`rao eval --compare`: agent modes compared (comma list)")
    context_limits: str = opt(
        "", "`rao eval --compare`: max_context_tokens values compared (comma list; empty = agent's)"
    )
    trees_to_render: int = opt(4, "tree viewer pages written and logged per round (0: none)")


@dataclass
class TrackingConfig:
    """MLflow. The default is SQLite in runs_dir with a local artifact folder."""

    enabled: bool = opt(True, "log to MLflow")
    uri: str = opt("", "tracking URI; empty means sqlite:///<runs_dir>/mlflow.db")
    experiment: str = opt("rao", "MLflow experiment name")
    log_checkpoints: bool = opt(True, "log each round's checkpoint folder as an artifact (small models)")


@dataclass
class CampaignConfig:
    """The training campaign: warm start, then rounds of rollout -> score -> train -> evaluate."""

    rounds: int = opt(8, "RL rounds of the campaign (`rao round` / the schedule add more)")
    control_arm: bool = opt(
        False,
        "also train the single-agent control arm with the same budget (run <run_name>-single: "
        "agent.mode single, plain group baseline, no depth weighting, lambda 0)",
    )


@dataclass
class RunConfig:
    run_name: str = opt("default", "folder name under runs_dir")
    runs_dir: str = opt("runs", "root folder of all runs")
    suite: Literal["textcraft", "textcraft-small", "oolong", "deepdive"] = opt(
        "textcraft-small",
        "task suite: TextCraft-Synth (reference or the tiny-model profile), oolong (long-context "
        "aggregation) or deepdive (deep search)",
    )
    world: WorldConfig = field(default_factory=WorldConfig)
    tasks: TaskConfig = field(default_factory=TaskConfig)
    deepdive: DeepDiveConfig = field(default_factory=DeepDiveConfig)
    oolong: OolongConfig = field(default_factory=OolongConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    campaign: CampaignConfig = field(default_factory=CampaignConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.run_name


DIFFICULTIES = {"easy": (2, 3), "medium": (4, 6), "hard": (7, 9), "extreme": (10, 12)}


def validate(cfg: RunConfig) -> RunConfig:
    """Cross-field checks; each failure names the field."""

    def need(ok: bool, name: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"{name}: {why}")

    need(1 <= cfg.world.domains <= 5, "world.domains", "must be 1..5")
    need(2 <= cfg.world.max_tier <= 12, "world.max_tier", "must be 2..12")
    need(cfg.world.items_per_tier >= 2, "world.items_per_tier", "must be >= 2")
    need(0.0 < cfg.tasks.val_fraction < 1.0, "tasks.val_fraction", "must be in (0, 1)")
    for name in ("people", "organisations", "places", "works"):
        need(getattr(cfg.deepdive, name) >= 8, f"deepdive.{name}", "must be >= 8")
    need(0.0 < cfg.deepdive.val_fraction < 1.0, "deepdive.val_fraction", "must be in (0, 1)")
    need(cfg.deepdive.page_chars >= 200, "deepdive.page_chars", "must be >= 200")
    for diff, sizes in cfg.oolong.difficulty_tokens.items():
        ok = isinstance(sizes, list) and bool(sizes) and all(isinstance(n, int) and n >= 256 for n in sizes)
        need(diff in DIFFICULTIES, "oolong.difficulty_tokens", f"unknown difficulty {diff!r}")
        need(ok, f"oolong.difficulty_tokens.{diff}", "must be a non-empty list of ints >= 256")
    need(cfg.oolong.chars_per_token > 0, "oolong.chars_per_token", "must be > 0")
    need(2 <= cfg.oolong.speakers <= 12, "oolong.speakers", "must be 2..12")
    need(cfg.oolong.chunk_chars >= 500, "oolong.chunk_chars", "must be >= 500")
    need(cfg.oolong.tasks_per_difficulty >= 1, "oolong.tasks_per_difficulty", "must be >= 1")
    d = cfg.tasks.distractors
    need(len(d) == 2 and 0 <= d[0] <= d[1], "tasks.distractors", "must be [min, max] with min <= max")
    for name in ("max_depth", "max_steps", "max_nodes", "max_context_tokens", "max_new_tokens"):
        need(getattr(cfg.agent, name) >= (0 if name == "max_depth" else 1), f"agent.{name}", "too small")
    need(cfg.agent.loop_guard >= 2, "agent.loop_guard", "must be >= 2")
    need(cfg.agent.cell_timeout_s > 0, "agent.cell_timeout_s", "must be > 0")
    need(cfg.sandbox.memory_mb >= 128, "sandbox.memory_mb", "must be >= 128")
    need(0.0 <= cfg.policy.error_rate <= 1.0, "policy.error_rate", "must be in [0, 1]")
    need(cfg.policy.temperature >= 0.0, "policy.temperature", "must be >= 0")
    need(cfg.policy.kind != "openai" or bool(cfg.policy.base_url), "policy.base_url", "needed by kind openai")
    for diff in cfg.rollout.difficulty.split(","):
        need(diff.strip() in DIFFICULTIES, "rollout.difficulty", f"unknown difficulty {diff!r}")
    need(cfg.rollout.num_tasks >= 1, "rollout.num_tasks", "must be >= 1")
    need(cfg.rollout.group_size >= 1, "rollout.group_size", "must be >= 1")
    need(1 <= cfg.rollout.shards <= cfg.rollout.num_tasks, "rollout.shards", "must be 1..rollout.num_tasks")
    need(cfg.rollout.num_cpus_per_shard > 0, "rollout.num_cpus_per_shard", "must be > 0")
    need(cfg.rollout.num_gpus_per_shard >= 0, "rollout.num_gpus_per_shard", "must be >= 0")
    need(cfg.scoring.lam >= 0.0, "scoring.lam", "must be >= 0")
    for diff in cfg.eval.difficulty.split(","):
        need(diff.strip() in DIFFICULTIES, "eval.difficulty", f"unknown difficulty {diff!r}")
    need(cfg.eval.num_tasks >= 1, "eval.num_tasks", "must be >= 1")
    need(cfg.eval.samples >= 1, "eval.samples", "must be >= 1")
    need(cfg.eval.samples == 1 or cfg.eval.temperature > 0, "eval.samples", "> 1 needs eval.temperature > 0")
    judge = cfg.judge
    need(
        judge.kind in ("none", "scripted") or bool(judge.model), "judge.model", f"needed by kind {judge.kind}"
    )
    need(judge.kind != "openai" or bool(judge.base_url), "judge.base_url", "needed by kind openai")
    for mode in cfg.eval.modes.split(","):
        need(mode.strip() in ("single", "recursive"), "eval.modes", f"unknown mode {mode!r}")
    for limit in filter(None, (x.strip() for x in str(cfg.eval.context_limits).split(","))):
        need(limit.isdigit() and int(limit) >= 256, "eval.context_limits", f"{limit!r} is not an int >= 256")
    need(cfg.campaign.rounds >= 0, "campaign.rounds", "must be >= 0")
    need("/" not in cfg.run_name and cfg.run_name not in ("", ".", ".."), "run_name", "must be a plain name")
    return cfg


def _coerce(value: Any, typ: Any, name: str) -> Any:
    """Check a YAML value against a field's annotation (int, float, bool, str, list, Literal)."""
    origin = typing.get_origin(typ)
    if origin is Literal:
        if value not in typing.get_args(typ):
            raise ConfigError(f"{name}: {value!r} is not one of {list(typing.get_args(typ))}")
        return value
    if origin in (types.UnionType, typing.Union):
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is float and isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
        try:
            return float(value)
        except ValueError:
            pass
    base = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "dict": dict}.get(
        getattr(typ, "__name__", str(typ)), typ
    )
    if isinstance(base, type) and (not isinstance(value, base) or (base is int and isinstance(value, bool))):
        raise ConfigError(f"{name}: expected {base.__name__}, got {value!r}")
    return value


def _apply(obj: Any, data: dict, prefix: str = "") -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"{name}: unknown field (known: {', '.join(sorted(names))})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: expected a mapping")
            _apply(current, value, prefix=f"{name}.")
        else:
            setattr(obj, key, _coerce(value, hints[key], name))


def parse_override(text: str) -> dict:
    """'agent.max_depth=3' -> {'agent': {'max_depth': 3}} (the value is read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value")
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    out: dict = {}
    cur = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


# The defaults above are the embedded CPU campaign: the shipped warm-started tiny model on
# TextCraft-Synth's small profile. The other suites need an instruction-following LLM; their
# defaults are the reference agent profile of the paper with the scripted expert as the policy (a
# model is a `policy.kind`/`policy.model` away), plus each suite's paper setup. Applied by
# load_config before the YAML file and --set, so a value the user sets always wins.
REFERENCE_PROFILE: dict[str, dict] = {
    "agent": {
        "reply_format": "thought_python",
        "max_context_tokens": 8192,
        "max_new_tokens": 512,
        "max_steps": 25,
    },
    "policy": {"kind": "scripted", "model": "tiny"},
    "rollout": {"difficulty": "medium", "num_tasks": 8, "group_size": 4},
    "eval": {"difficulty": "easy,medium,hard"},
    "train": {"lr": 3e-6, "steps_per_round": 1},
}
SUITE_DEFAULTS: dict[str, list[dict]] = {
    "textcraft": [REFERENCE_PROFILE],
    "oolong": [REFERENCE_PROFILE, {"scoring": {"lam": 0.4}, "agent": {"max_depth": 2}}],
    "deepdive": [REFERENCE_PROFILE, {"agent": {"max_depth": 4}}],
}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    layers: list[dict] = []
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        layers.append(data)
    layers += [parse_override(text) for text in overrides or []]
    suite = next((layer["suite"] for layer in reversed(layers) if "suite" in layer), RunConfig().suite)
    cfg = RunConfig()
    for layer in [*(SUITE_DEFAULTS.get(suite, []) if isinstance(suite, str) else []), *layers]:
        _apply(cfg, layer)
    return validate(cfg)


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
