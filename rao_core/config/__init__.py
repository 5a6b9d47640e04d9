"""The run configuration: sections (every default, help string and rule), the parsing and merging of
layers. A run's configuration is loaded by rao_core.run.load_config (above the suites, whose
defaults are a layer):

from rao_core.run import load_config
cfg = load_config("run.yaml", ["agent.max_depth=3"])   # ConfigError (one line) on bad input
"""

from rao_core.config.loading import (
    ConfigError,
    ConfigWarning,
    build,
    parse_override,
    save_config,
    to_dict,
)
from rao_core.config.policy import ENGINES, HFPolicy, OpenAIPolicy, PolicyConfig, ScriptedPolicy, VLLMPolicy
from rao_core.config.sections import (
    AgentConfig,
    CampaignConfig,
    EvalConfig,
    JudgeConfig,
    RolloutConfig,
    RunConfig,
    SandboxConfig,
    ScoringConfig,
    TaskConfig,
    TrackingConfig,
    TrainConfig,
    WarmStartConfig,
)
from rao_core.config.types import opt

__all__ = [
    "AgentConfig", "CampaignConfig", "ConfigError", "ConfigWarning",
    "EvalConfig", "JudgeConfig", "PolicyConfig", "RolloutConfig",
    "RunConfig", "SandboxConfig", "ScoringConfig", "TaskConfig", "TrackingConfig", "TrainConfig",
    "WarmStartConfig", "build", "ENGINES", "HFPolicy", "VLLMPolicy", "OpenAIPolicy", "ScriptedPolicy", "opt", "parse_override", "save_config",
    "to_dict",
]  # fmt: skip
