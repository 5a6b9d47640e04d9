import pytest

from rao_core.models.dtypes import BF16_FLAGS, cpu_has_bf16

pytest.register_assert_rewrite("tests.real.rounds")  # its asserts print their values, as a test's do

# SmolLM2's rounds, LoRA rounds and the memory plan's train stage are the real tier's heavy part. On a
# CPU with bf16 matrix units the whole tier took about 14 min of test time in make test; on one without
# (an AVX2-only AMD EPYC, measured in make test): the warm start 267 s, a full-update round pair 390 s on either engine, and the LoRA
# pairs over 900 s each, in float32 (models/dtypes.py), which would take CI past its time. There
# they are skipped, saying why; the conversion and the bf16 agreement test run on every CPU.
needs_bf16_units = pytest.mark.skipif(
    not cpu_has_bf16(),
    reason=f"SmolLM2 rounds need a CPU with bf16 matrix units ({' or '.join(BF16_FLAGS)} in /proc/cpuinfo) "
    "to fit CI's time; float32 on this CPU took 390 s for a round pair and over 900 s with LoRA",
)
