from pathlib import Path

import pytest

from rao_core.config import ConfigError, parse_override
from rao_core.run import load_config


def test_defaults_validate():
    cfg = load_config()
    assert cfg.agent.max_depth == 6 and cfg.rollout.group_size >= 1


def test_overrides_and_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_name: x\nagent:\n  max_steps: 7\n")
    cfg = load_config(path, ["agent.max_depth=2", "scoring.lam=0.4", "tasks.seed=3", "train.lr=1e-3"])
    assert cfg.train.lr == 0.001
    assert (cfg.run_name, cfg.agent.max_steps, cfg.agent.max_depth, cfg.scoring.lam) == ("x", 7, 2, 0.4)
    assert parse_override("a.b=3") == {"a": {"b": 3}}


@pytest.mark.parametrize(
    "override, field",
    [
        ("agent.max_stepz=3", "agent.max_stepz"),
        ("agent.max_steps=abc", "agent.max_steps"),
        ("agent.mode=flat", "agent.mode"),
        ("rollout.difficulty=impossible", "rollout.difficulty"),
        ("policy.error_rate=2", "policy.error_rate"),
        ("agent.max_depth=true", "agent.max_depth"),
        ("run_name=../x", "run_name"),
        ("judge.kind=hf", "judge.model"),
        ("eval.modes=recursive,flat", "eval.modes"),
        ("eval.context_limits=100", "eval.context_limits"),
        ("eval.samples=4", "eval.samples"),  # greedy samples are all the same tree
    ],
)
def test_bad_input_names_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert str(err.value).startswith(field)
    assert "\n" not in str(err.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent.yaml")


def test_shipped_configs_load():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        load_config(path, check_files=False)  # their checkpoints live on GPU machines


# --- every field validated at load: `rao train --check` ------------------------------------------
BAD = [  # (override, key the one-line error must name)
    ("rollout.max_concurrent_trees=0", "rollout.max_concurrent_trees"),  # hung the rollout forever
    ("rollout.group_size=1", "rollout.group_size"),  # trained nothing, silently
    ("train.bf16=maybe", "train.bf16"),
    ("train.lr=-1", "train.lr"),
    ("train.betas=[5]", "train.betas"),
    ("train.betas=[0.9, 0.95, 0.99]", "train.betas"),
    ("agent.reply_format=nonsense", "agent.reply_format"),
    ("train.beta=-0.1", "train.beta"),
    ("train.temperature=0.7", "train.temperature"),  # one source of truth: the recorded one
    ("train.loss_type=ppo", "train.loss_type"),
    ("train.steps_per_round=0", "train.steps_per_round"),
    ("train.max_tokens_per_microbatch=0", "train.max_tokens_per_microbatch"),
    ("train.clip_high=0", "train.clip_high"),
    ("train.device=tpu", "train.device"),
    ("train.accelerate_config=/no/such.yaml", "train.accelerate_config"),
    ("policy.temperature=-0.5", "policy.temperature"),
    ("policy.kind=vllmm", "policy.kind"),
    ("policy.model=/no/such/checkpoint", "policy.model"),
    ("policy.kind=openai", "policy.base_url"),
    ("policy.retries=0", "policy.retries"),
    ("agent.max_steps=0", "agent.max_steps"),
    ("agent.max_new_tokens=4096", "agent.max_new_tokens"),  # leaves no room in a 2048-token context
    ("agent.cell_timeout_s=0", "agent.cell_timeout_s"),
    ("agent.loop_guard=1", "agent.loop_guard"),
    ("sandbox.memory_mb=64", "sandbox.memory_mb"),
    ("sandbox.seccomp=perhaps", "sandbox.seccomp"),
    ("scoring.lam=-0.1", "scoring.lam"),
    ("scoring.unfinished_roots=maybe", "scoring.unfinished_roots"),
    ("eval.num_tasks=0", "eval.num_tasks"),
    ("eval.difficulty=medium,impossible", "eval.difficulty"),
    ("eval.context_limits=2048,abc", "eval.context_limits"),
    ("campaign.rounds=1.5", "campaign.rounds"),
    ("campaign.control_arm=3", "campaign.control_arm"),
    ("tracking.enabled=no please", "tracking.enabled"),
    ("warmstart.lr=0", "warmstart.lr"),
    ("warmstart.kv_heads=3", "warmstart.kv_heads"),
    ("warmstart.init_model=/no/such/checkpoint", "warmstart.init_model"),
    ("warmstart.root_inline_rate=1.5", "warmstart.root_inline_rate"),
    ("train.lr_final=-1", "train.lr_final"),
    ("suite_args.tasks_per_difficulty=0", "suite_args.tasks_per_difficulty"),
    ("world.domains=2", "world.domains"),  # moved to suite_args of suite textcraft
    ("suite=minecraft", "suite"),
    ("rollout=4", "rollout"),
    ("rollout.shards=0", "rollout.shards"),
]


@pytest.mark.timeout(150)  # 5 s a case at most, as a whole: validation does no work
@pytest.mark.parametrize("override, key", BAD, ids=[o for o, _ in BAD])
def test_bad_settings_are_refused_at_load_in_one_line(tmp_path, capsys, override, key):
    from flows.cli import main

    code = main(["train", "--check", "--set", f"runs_dir={tmp_path}", "--set", override])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"config error: {key}")
    assert list(tmp_path.iterdir()) == []  # no run folder, nothing written


def test_check_prints_the_resolved_config_and_runs_nothing(tmp_path, capsys):
    import yaml

    from flows.cli import main

    assert (
        main(["train", "--check", "--set", f"runs_dir={tmp_path}", "--set", "eval.context_limits=2048"]) == 0
    )
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["eval"]["context_limits"] == [2048] and printed["train"]["lr"] == 3e-4
    assert list(tmp_path.iterdir()) == []


def test_validation_loads_neither_torch_nor_prefect(tmp_path):
    """Why --check is quick: a bad setting is refused before any heavy import."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom flows.cli import main\n"
        f"rc = main(['train', '--check', '--set', 'runs_dir={tmp_path}', '--set', 'train.lr=-1'])\n"
        "print(rc, 'torch' in sys.modules, 'prefect' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False", "False"], out.stderr


@pytest.mark.parametrize("value", ["2048", "[1024, 2048]", "1024,2048"])
def test_a_list_field_takes_one_value_or_many(value):
    cfg = load_config(overrides=[f"eval.context_limits={value}"])
    assert cfg.eval.context_limits in ([2048], [1024, 2048])


def test_replace_cannot_make_a_bad_config():
    import dataclasses

    from pydantic import ValidationError

    cfg = load_config()
    with pytest.raises(ValidationError):
        dataclasses.replace(cfg.rollout, max_concurrent_trees=0)


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("warmstart.eval_difficulties", "hard,medium", ["hard", "medium"]),
        ("warmstart.eval_difficulties", "hard", ["hard"]),
        ("warmstart.recursive_tiers", "2,3", [2, 3]),
        ("warmstart.flat_tiers", "1", [1]),
        ("train.betas", "0.9,0.99", [0.9, 0.99]),
        ("train.lora_targets", "q_proj,v_proj", ["q_proj", "v_proj"]),
        ("eval.difficulty", "hard,medium", ["hard", "medium"]),
    ],
)
def test_every_list_setting_takes_a_comma_list(key, text, value):
    """docs/cli.md: `--set key=a,b` sets a list, for every list setting."""
    section, name = key.split(".")
    assert getattr(getattr(load_config(overrides=[f"{key}={text}"]), section), name) == value
    if "tiers" in key or "betas" in key:  # the entries are still checked
        with pytest.raises(ConfigError, match=key):
            load_config(overrides=[f"{key}=a,7"])


def test_explain_shows_the_engines_default_kind_and_the_active_suites_arguments():
    from rao_core.config.explain import explain
    from rao_core.envs.registry import suite_class

    assert explain("policy.kind").startswith("policy.kind = 'hf'  (one of scripted, hf, vllm, openai;")
    args = explain("suite_args", suite_class("examples.filecount.suite:FileCount").Args)
    assert "suite_args.tasks_per_difficulty = 200  (int >= 1;" in args and "suite_args.seed = 0" in args


def test_explain_works_on_a_partial_configuration(capsys):
    """`rao config --explain` needs only the suite (for its suite_args), not a complete or valid
    configuration: a difficulty the suite lacks or an engine without its needed settings is fine."""
    from flows.cli import main

    plugin = ["--set", "suite=examples.filecount.suite:FileCount", "--set", "rollout.difficulty=nope"]
    assert main(["config", "--explain", "suite_args", *plugin]) == 0
    assert "suite_args.tasks_per_difficulty = 200" in capsys.readouterr().out
    assert main(["config", "--explain", "policy", "--set", "policy.kind=openai"]) == 0
    assert "policy.base_url [policy.kind openai]" in capsys.readouterr().out
    assert main(["config", "--explain", "suite_args", "--set", "suite=nope:Nope"]) == 2
    assert capsys.readouterr().err.startswith("config error: suite: 'nope:Nope': cannot import nope")


def test_the_training_launcher_settings_are_checked(tmp_path):
    """train.launcher=torchrun needs an accelerate config; several nodes need the rendezvous and
    the node command, and must divide the config's processes."""
    ddp = f"train.accelerate_config={Path(__file__).resolve().parents[1] / 'configs/accelerate/ddp-cpu.yaml'}"
    with pytest.raises(ConfigError, match="train.launcher: torchrun: needs train.accelerate_config"):
        load_config(overrides=[f"runs_dir={tmp_path}", "train.launcher=torchrun"])
    with pytest.raises(
        ConfigError, match="train.nnodes: 2: needs train.launcher=torchrun, train.rdzv_endpoint"
    ):
        load_config(overrides=[f"runs_dir={tmp_path}", ddp, "train.launcher=torchrun", "train.nnodes=2"])
    nodes = ["train.launcher=torchrun", "train.rdzv_endpoint=head:29500", "train.node_command=srun -N3"]
    with pytest.raises(ConfigError, match="train.nnodes: 3: does not divide the 2 processes"):
        load_config(overrides=[f"runs_dir={tmp_path}", ddp, *nodes, "train.nnodes=3"])
    assert load_config(overrides=[f"runs_dir={tmp_path}", ddp, *nodes, "train.nnodes=2"]).train.nnodes == 2
