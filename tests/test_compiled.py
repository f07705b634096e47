"""Saved activations of a torch.compile'd transformers model (issue 11, item 3).

The graph walk of planner.calibrate.compiled is checked against the saved-tensor hooks of the
eager harness (planner.calibrate.hf_models, itself checked against the hf-sdpa inventory in
test_hf_implementations.py) on an eager model; then the compiled model's saves are measured
and checked against the claim docs/implementations.md §10 makes: the hf-sdpa inventory is an
upper bound of what Inductor's partitioner keeps.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("transformers")
from planner.calibrate import hf_models  # noqa: E402
from planner.calibrate.compiled import compiled_saved, measure_saved  # noqa: E402
from planner.calibrate.hf_run import implementation_for  # noqa: E402
from planner.io.hf_config import model_from_hf_dict  # noqa: E402
from planner.memory import implementations as impls  # noqa: E402

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_attention_heads=4,
             num_key_value_heads=4, num_hidden_layers=1, vocab_size=256, max_position_embeddings=128)


def test_graph_walk_equals_the_hooks_on_an_eager_model():
    model = hf_models.build_model(LLAMA, "sdpa", "fp32", device="cpu")
    walked = sum(measure_saved(model, 32, 2).values())
    hooked = hf_models.measure(model, 32, 2, "fp32", flops=False).total_bytes()
    assert walked == hooked


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="Inductor on CPU needs a C compiler")
def test_compiled_model_saves_no_more_than_the_sdpa_inventory():
    model = hf_models.build_model(LLAMA, "sdpa", "fp32", device="cpu")
    spec = model_from_hf_dict(LLAMA, name="llama-small")
    inventory = impls.model_saved_bytes(spec, implementation_for(LLAMA, "sdpa", "fp32", "cpu"), 32, 2)
    saved = compiled_saved(model, 32, 2)
    assert set(saved) <= {"CompiledFunctionBackward"}, saved  # one graph, no break
    assert 0 < sum(saved.values()) <= inventory
