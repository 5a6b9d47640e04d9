"""The run configuration: one dataclass per section, every default and every rule in one place.

Each field is `opt(default, help, **rule)`: the rule is pydantic's (ge, gt, le, lt, min_length,
...), checked whenever a section is built, so a bad value is refused at load, before any work,
and `dataclasses.replace` cannot produce one either. Rules that tie several fields together
live in `RunConfig._cross_field_rules`. Loading (YAML, --set, suite profiles) is in loading.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool, model_validator

from rao_core.config.policy import (
    AnyPolicy,
    HFPolicy,
)
from rao_core.config.train import TrainConfig
from rao_core.config.types import (
    ContextLimits,
    Difficulties,
    Float,
    Int,
    Modes,
    opt,
    section,
)
from rao_core.config.warmstart import WarmStartConfig
from rao_core.layout import RunLayout


@section
class TaskConfig:
    """Which tasks a run meets. A suite's own settings (how many tasks, their sizes, a world's seed)
    are its `suite_args`; this seed is the run's."""

    seed: Int = opt(
        0,
        "seed of the run's tasks: the tasks each round (tasks.seed + round) and the held-out "
        "evaluation draw, and the data of suites that synthesize from it (TextCraft's)",
    )


@section
class AgentConfig:
    """The recursive agent and its budgets; all are enforced by the runtime."""

    mode: Literal["recursive", "single"] = opt("recursive", "single removes launch_subagent")
    max_depth: Int = opt(6, "depth cap (root = 0); launches past it are refused", ge=0)
    max_steps: Int = opt(40, "model turns per node", ge=1)
    max_children: Int = opt(8, "sub-agents one node may start", ge=0)
    max_nodes: Int = opt(64, "nodes per tree, root included", ge=1)
    max_context_tokens: Int = opt(2048, "tokens per node; overflow ends the node as failed", ge=16)
    max_new_tokens: Int = opt(32, "tokens sampled per turn", ge=1)
    cell_timeout_s: Float = opt(10.0, "wall-clock limit of one cell", gt=0)
    tree_timeout_s: Float = opt(600.0, "wall-clock limit of one tree", gt=0)
    loop_guard: Int = opt(4, "end a node that sends the same cell this many times in a row", ge=2)
    max_observation_chars: Int = opt(2000, "cell output beyond this is truncated", ge=16)
    max_calls_per_cell: Int = opt(200, "tool and launch calls one cell may make", ge=1)
    reply_format: Literal["thought_python", "python", "markdown"] = opt(
        "python", "reply format: thought_python (reference), python (terse), markdown"
    )

    @model_validator(mode="after")
    def _room(self) -> AgentConfig:
        if self.max_new_tokens >= self.max_context_tokens:
            raise ValueError(
                f"agent.max_new_tokens: {self.max_new_tokens}: must be below agent.max_context_tokens "
                f"({self.max_context_tokens})"
            )
        return self


@section
class SandboxConfig:
    """Limits of the REPL worker processes that run model-written cells."""

    memory_mb: Int = opt(1024, "address-space limit of a worker (RLIMIT_AS)", ge=128)
    cpu_seconds: Int = opt(120, "CPU-time limit of a worker over its life (RLIMIT_CPU)", ge=1)
    seccomp: StrictBool = opt(True, "install the seccomp filter (no files, network, processes)")
    max_output_chars: Int = opt(100_000, "stdout a cell may produce before it is cut", ge=100)
    tool_threads: Int = opt(
        8, "worker threads that run the suite's plain (non-async) tools, so none stalls the event loop",
        ge=1, resume="free",
    )  # fmt: skip


@section
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
    base_url: str = opt("", "openai: server URL, e.g. http://127.0.0.1:8001/v1", resume="free")
    served_model: str = opt("", "openai: model name on the server (default: model)")
    api_key_env: str = opt("OPENAI_API_KEY", "openai: environment variable holding the key", resume="free")
    temperature: Float = opt(0.0, "judge sampling temperature (0 = greedy, reproducible verdicts)", ge=0)
    max_new_tokens: Int = opt(256, "tokens the judge may write per verdict", ge=1)
    gpu_memory_utilization: Float = opt(
        0.3, "vllm: GPU memory fraction of the judge's own engine", gt=0, le=1, resume="free"
    )
    cache: StrictBool = opt(
        True, "reuse verdicts by (rubric, model, goal, answer, reference); <run>/judge_cache/"
    )
    retries: Int = opt(3, "attempts per verdict when the judge's engine fails", ge=1, resume="free")
    rubric: str = opt(
        "", "a text file holding the judge's system prompt (empty: the built-in rubric, docs/judges.md); "
        "it must ask for the JSON verdict {success, score, reason}",
    )  # fmt: skip


@section
class RolloutConfig:
    split: str = opt("train", "which split's tasks to roll out (one the suite declares)", min_length=1)
    difficulty: Difficulties = opt(
        ["hard"], "difficulties to draw from: a list of the suite's labels (TextCraft: easy..extreme), or a,b"
    )
    num_tasks: Int = opt(8, "root tasks N", ge=1)
    group_size: Int = opt(
        12,
        "trees per root task G (the leave-one-out baseline needs G >= 2); large groups hold both "
        "delegating and inline trees of one task, which is what teaches delegation (docs/main-job.md)",
        ge=1,
    )
    max_concurrent_trees: Int = opt(
        96, "trees in flight at once (the seeding makes the trees the same at any value)", ge=1, resume="free"
    )
    seed: Int = opt(
        0, "seed of sampling: each request draws from its own generator, seeded by (seed, round, node, turn)"
    )
    shards: Int = opt(
        1,
        "root tasks (and held-out tasks) are dealt into this many shards, each with its own engine replica and partition",
        ge=1,
        resume="free",
    )
    runner: Literal["local", "ray"] = opt(
        "local",
        "local: shards one after another in this process; ray: in parallel as Ray tasks",
        resume="free",
    )
    ray_address: str = opt(
        "", "runner ray: '' starts a local Ray instance; 'auto' or ray://host:10001 joins one", resume="free"
    )
    num_cpus_per_shard: Float = opt(
        1.0, "runner ray: CPUs reserved per shard (its trees and REPL workers)", gt=0, resume="free"
    )
    num_gpus_per_shard: Float = opt(
        0.0,
        "runner ray: GPUs reserved per shard (policy.tensor_parallel_size for vllm, 1 for hf on GPU)",
        ge=0,
        resume="free",
    )
    placement_timeout_s: Float = opt(
        120.0,
        "runner ray: seconds to wait for a node with room for a shard (an autoscaler may add one) "
        "before the stage fails",
        gt=0,
        resume="free",
    )


@section
class ScoringConfig:
    """RAO's training signal (Eq. 1, 3, 4) and the choices the reference leaves open."""

    lam: Float = opt(0.0, "lambda of Eq. 1: weight of the children's mean success", ge=0)
    depth_weighting: StrictBool = opt(True, "Eq. 4 depth balancing; False gives w = 1")
    unfinished_roots: Literal["keep", "drop"] = opt("keep", "trees whose root never finished")
    single_tree_groups: Literal["skip", "zero_baseline"] = opt("skip", "groups with one valid tree")
    zero_advantage_groups: Literal["skip", "keep"] = opt("skip", "groups whose advantages are all 0")


@section
class EvalConfig:
    """Held-out evaluation after each round (greedy by default, one tree per task)."""

    split: str = opt("val", "the held-out split evaluated (one the suite declares)", min_length=1)
    num_tasks: Int = opt(32, "validation tasks per difficulty", ge=1)
    difficulty: Difficulties = opt(
        ["medium", "hard"], "difficulties evaluated (a list of the suite's labels, or a,b)"
    )
    temperature: Float = opt(0.0, "sampling temperature of evaluation (0 = greedy)", ge=0)
    samples: Int = opt(
        1, "trees per held-out task; > 1 needs temperature > 0 (success = mean over them)", ge=1
    )
    modes: Modes = opt(
        ["single", "recursive"], "`rao eval --compare`: agent modes compared (a list, or a,b)", resume="free"
    )
    context_limits: ContextLimits = opt(
        [],
        "`rao eval --compare`: max_context_tokens values compared (a list, or a,b; none: the agent's)",
        resume="free",
    )
    trees_to_render: Int = opt(
        4, "tree viewer pages written and logged per round (0: none)", ge=0, resume="free"
    )

    @model_validator(mode="after")
    def _samples(self) -> EvalConfig:
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(
                f"eval.samples: {self.samples}: > 1 needs eval.temperature > 0 (greedy trees are all the same)"
            )
        return self


@section
class TrackingConfig:
    """MLflow. The default is SQLite in runs_dir with a local artifact folder."""

    enabled: StrictBool = opt(True, "log to MLflow", resume="free")
    uri: str = opt("", "tracking URI; empty means sqlite:///<runs_dir>/mlflow.db", resume="free")
    experiment: str = opt("rao", "MLflow experiment name", min_length=1, resume="free")
    log_checkpoints: StrictBool = opt(
        True, "log each round's checkpoint folder as an artifact (small models)", resume="free"
    )


@section
class CampaignConfig:
    """The training campaign: warm start, then rounds of rollout -> score -> train -> evaluate."""

    rounds: Int = opt(
        12, "RL rounds of the campaign (`rao round` / the schedule add more)", ge=0, resume="free"
    )
    control_arm: StrictBool = opt(
        False,
        "also train the single-agent control arm with the same budget (run <run_name>-single: "
        "agent.mode single, plain group baseline, no depth weighting, lambda 0)",
        resume="free",
    )
    control_tasks: Int = opt(
        0,
        "root tasks per round of the control arm (0: rollout.num_tasks). Single-agent trees are "
        "shorter; raise it until both arms sample as many tokens (reports/learning_curves.md)",
        ge=0,
    )
    max_staleness: Int = opt(
        0,
        "k: round r samples its trees with policy version max(0, r - k). 0: every round samples "
        "with the version it trains (rollout, then training, in turn). k >= 1: the engines roll "
        "out the next rounds and evaluate while the trainer trains (both busy, about max(rollout + "
        "evaluation, training) a round instead of their sum), at the price of trees up to k "
        "versions old, corrected by the importance ratio, a trust region (train.trust_region: auto "
        "= 0.3) and a guard that drops a round whose mismatch KL jumps (train.kl_guard: auto = "
        "skip); scoring drops any older tree. Pays "
        "where engines and trainer have hardware of their own (not on 2 CPU cores); watch the "
        "train line's sampler mismatch KL (docs/overlap.md)",
        ge=0,
        resume="free",
    )
    wait_timeout_s: Float = opt(
        14400.0,
        "k >= 1: how long a stage may wait for another's output (a rollout for its checkpoint, the "
        "trainer for a rollout) before the campaign stops with an error instead of hanging; keep it "
        "above the longest rollout or training",
        gt=0,
        resume="free",
    )


@section
class RunConfig:
    run_name: Annotated[str, AfterValidator(lambda s: _plain_name(s))] = opt(
        "default", "folder name under runs_dir", resume="free"
    )
    runs_dir: str = opt("runs", "root folder of all runs", min_length=1, resume="free")
    suite: str = opt(
        "textcraft-small",
        "task suite: a registered name (textcraft, textcraft-small: TextCraft-Synth's reference and "
        "tiny-model profiles; oolong: long-context aggregation; deepdive: deep search; dataset: "
        "tasks from a Parquet file or datasets folder) or a suite of your own as module:Class "
        "(docs/own-task.md)",
        min_length=1,
    )
    suite_args: dict[str, Any] = opt(
        {},
        "the suite's own settings, checked by its Args model (`rao config --explain suite_args` lists the "
        "active suite's: textcraft's world and task sizes, oolong's and deepdive's generators, dataset's path)",
    )
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    policy: AnyPolicy = Field(default_factory=HFPolicy)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    campaign: CampaignConfig = Field(default_factory=CampaignConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    warmstart: WarmStartConfig = Field(default_factory=WarmStartConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.run_name

    @property
    def layout(self) -> RunLayout:
        """Every path and completeness check of this run's folder (rao_core/layout.py)."""
        return RunLayout(self.run_dir)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunConfig:
        """Rules between sections; each message names the key, its value and the rule."""
        j, r = self.judge, self.rollout
        rules = [
            (j.kind in ("none", "scripted") or bool(j.model), "judge.model", j.model, f"needed by judge.kind {j.kind}"),
            (j.kind != "openai" or bool(j.base_url), "judge.base_url", j.base_url, "needed by judge.kind openai"),
            (r.shards <= r.num_tasks, "rollout.shards", r.shards, f"must be <= rollout.num_tasks ({r.num_tasks})"),
            (
                r.shards == 1 or r.shards <= self.eval.num_tasks * len(self.eval.difficulty), "rollout.shards", r.shards,
                f"must be <= the held-out tasks (eval.num_tasks x difficulties = {self.eval.num_tasks * len(self.eval.difficulty)})",
            ),
            (
                r.group_size >= 2 or self.scoring.single_tree_groups == "zero_baseline",
                "rollout.group_size", r.group_size,
                "must be >= 2: with one tree per task every group is skipped and nothing is trained "
                "(or set scoring.single_tree_groups=zero_baseline)",
            ),
        ]  # fmt: skip
        for ok, key, value, why in rules:
            if not ok:
                raise ValueError(f"{key}: {value!r}: {why}")
        return self


def _plain_name(name: str) -> str:
    if "/" in name or name in ("", ".", ".."):
        raise ValueError("must be a plain folder name")
    return name
