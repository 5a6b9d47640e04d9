import pytest

from rao_core.config import ConfigError, load_config, parse_override


def test_defaults_validate():
    cfg = load_config()
    assert cfg.agent.max_depth == 6 and cfg.rollout.group_size >= 1


def test_overrides_and_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_name: x\nagent:\n  max_steps: 7\n")
    cfg = load_config(
        path, ["agent.max_depth=2", "scoring.lam=0.4", "tasks.distractors=[0, 1]", "train.lr=1e-3"]
    )
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
