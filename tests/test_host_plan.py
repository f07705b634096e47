"""Host memory wired into the plan (issue 11 phase 2, item 4): the named host accounting reaches
model_states' offload parts, the sweep and the verdict; --cpu-mem-gib reaches the node.

By hand: GPT-3 175B (174,604,259,328 parameters, `zplan show gpt3-175b`) on one DGX-2 (16 V100),
ZeRO-3 with optimizer and parameters on NVMe, dp = 16: each GPU's partition is
174,604,259,328 / 16 = 10,912,766,208 parameters; DeepSpeed keeps their 16-bit gradients in CPU
memory (2 x 10,912,766,208 = 21,825,532,416 bytes per GPU, 349,208,518,656 per node of 16 GPUs);
the paper's accounting puts them on NVMe.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core.columns import LayoutColumns
from planner.core.spec import Layout
from planner.io.jobfile import make_setup
from planner.io.loading import load_cluster, load_model
from planner.memory.plan import plan_memory
from planner.search import sweep

PARTITION = 174_604_259_328 // 16
GRADS_PER_NODE = 16 * 2 * PARTITION
LAYOUT = Layout(dp=16, zero_stage=3, offload_optimizer="nvme", offload_params="nvme",
                micro_batch=1, grad_accum=1, recompute="full")


def _plan(accounting):
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx2")
    setup = make_setup(2048, 16, 1e9, "zero-fp16", "adam", None, None, accounting)
    return model, cluster, setup, plan_memory(model, cluster, LAYOUT, setup)


def test_hand_figures():
    assert PARTITION == 10_912_766_208 and 174_604_259_328 % 16 == 0
    assert GRADS_PER_NODE == 349_208_518_656


def test_paper_accounting_moves_the_16bit_grads_to_nvme():
    _, _, _, engine = _plan("deepspeed")
    _, _, _, paper = _plan("zero-infinity-paper")
    assert engine.node.cpu_bytes - paper.node.cpu_bytes == GRADS_PER_NODE
    assert paper.node.nvme_bytes - engine.node.nvme_bytes == GRADS_PER_NODE
    assert "DeepSpeed's accounting" in engine.host_accounting_note
    assert "paper's accounting" in paper.host_accounting_note


@pytest.mark.parametrize("accounting", ["deepspeed", "zero-infinity-paper"])
def test_sweep_host_bytes_follow_the_accounting(accounting):
    model, cluster, setup, plan = _plan(accounting)
    cols = sweep.evaluate(model, cluster, setup, LayoutColumns.from_layout(LAYOUT))
    assert int(cols["node_cpu_bytes"][0]) == plan.node.cpu_bytes
    assert int(cols["node_nvme_bytes"][0]) == plan.node.nvme_bytes


def test_cli_cpu_mem_and_accounting_reach_the_verdict():
    runner = CliRunner()
    args = ["fit", "--model", "gpt3-175b", "--cluster", "dgx2", "--dp", "16", "--zero", "3",
            "--offload-optimizer", "nvme", "--offload-params", "nvme", "--recompute", "full",
            "--micro-batch", "1", "--grad-accum", "1", "--seq-len", "2048"]
    out = runner.invoke(app, [*args, "--host-accounting", "zero-infinity-paper", "--cpu-mem-gib", "64", "--json"])
    import json

    doc = json.loads(out.stdout)
    assert doc["memory"]["node"]["cpu_capacity_bytes"] == 64 * 2**30
    text = runner.invoke(app, [*args, "--host-accounting", "zero-infinity-paper"]).stdout
    assert "paper's accounting" in text.replace("\n", " ")
    bad = runner.invoke(app, [*args, "--host-accounting", "mine"])
    assert bad.exit_code == 2
