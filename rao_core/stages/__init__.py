"""The stages of a campaign, side by side, one module each (docs/house.md):

    synthesize -> warm_start -> roll_out -> score -> train -> evaluate -> report

Each is a function of the `Run` (rao_core/run.py) and the round (or the policy version), reads its
own sections of the configuration, and gets markers, resume and shards from `common`. No stage
imports another; the campaign (rao_core/campaign.py) and the Prefect tasks (tasks/stages.py) chain
them. Trees run only through the Sampler (rao_core/sampler.py).
"""
