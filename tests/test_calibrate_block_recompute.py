"""Partial recompute measured in torch: a 4-block GPT (the `zplan calibrate` model, fp32, CPU)
with the first n blocks wrapped as fms-fsdp wraps them (torch's `checkpoint_wrapper`,
CheckpointImpl.NO_REENTRANT: fms_fsdp/policies/ac_handler.py at 4ffb9bd), every storage saved
for backward counted with torch's saved_tensors_hooks (`planner.calibrate.measure.capture_saved`,
as tests/test_calibrate.py measures full recompute).

By hand (tests/test_calibrate.py's fp32 counts, seed 004 §2.2.3 at 4 bytes per activation and 1
per dropout mask): one block keeps 66sbh + 9as²b + 2·2·s·b·4 bytes, a recomputed one its fp32
input 4sbh; so each recomputed block saves the difference.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    CheckpointImpl, checkpoint_wrapper)

from planner.calibrate.config import scaled_model  # noqa: E402
from planner.calibrate.measure import capture_saved  # noqa: E402
from planner.calibrate.models import build_model  # noqa: E402
from planner.calibrate.run import token_batch  # noqa: E402
from planner.core.spec import Layout  # noqa: E402
from planner.io.loading import load_model  # noqa: E402
from planner.memory import activations as act  # noqa: E402

pytestmark = pytest.mark.torch

L, H, A, F, V = 4, 64, 4, 256, 100  # layers, hidden, heads, ffn (= 4h), vocab
S, B = 16, 2
SBH, AS2B = S * B * H, A * S * S * B
KEPT = 66 * SBH + 9 * AS2B + 2 * 2 * S * B * 4  # 154,112 bytes: one block, nothing recomputed
INPUT = 4 * SBH  # 8,192 bytes: a recomputed block's fp32 input
SPEC = scaled_model(load_model("gpt2"), layers=L, hidden=H, heads=A, ffn=F, vocab=V)


def saved_bytes(recomputed: int) -> int:
    """Every byte saved for backward in one training forward, the first `recomputed` blocks
    checkpointed (and the backward run, so the recompute happens)."""
    torch.manual_seed(0)
    net = build_model(SPEC, S, "none")
    for i in range(recomputed):
        net.blocks[i] = checkpoint_wrapper(net.blocks[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    net.train()
    tokens, labels = token_batch(SPEC, S, B, torch.device("cpu"), 0)
    loss, saved = capture_saved(net, lambda: net(tokens, labels))
    loss.backward()
    return sum(record[-1] for record in saved.records)


def test_two_of_four_blocks_recomputed_measured_against_hand_and_planner():
    none, two, four = saved_bytes(0), saved_bytes(2), saved_bytes(4)
    assert none - two == 2 * (KEPT - INPUT) == 291_840  # two blocks keep their input only
    assert none - four == 4 * (KEPT - INPUT)
    assert 2 * two == none + four  # n of L: n/L of full recompute + (L-n)/L of none
    layout = Layout(recompute="block", recompute_num_layers=2, flash_attention=False, micro_batch=B)
    assert act.block_recompute_saved_bytes(SPEC, layout, S, B, 4, L) == none - two
    assert act.layers_kept_bytes(SPEC, layout, S, B, 4, L) == 2 * INPUT + 2 * KEPT
