"""DeepSpeed config reader and writer: batch arithmetic, "auto", precision, ZeRO sections."""

from __future__ import annotations

import json

import pytest

from planner.core.errors import PlanInputError
from planner.io.deepspeed import deepspeed_config, layout_from_deepspeed, read_deepspeed_config
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import EngineBuffers, Layout, ModelSpec, TrainSetup

# A ZeRO-3 + CPU offload config as users write it (DeepSpeed docs "ZeRO-Offload" example shape)
ZERO3_OFFLOAD = {
    "train_batch_size": 256,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
    },
}

# The Hugging Face Trainer's template (transformers docs "DeepSpeed" ZeRO-2 example)
HF_AUTO = {
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "allgather_bucket_size": 2e8, "reduce_bucket_size": "auto"},
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def test_zero3_offload_layout():
    job = layout_from_deepspeed(ZERO3_OFFLOAD, num_gpus=16)  # 256 = 4 x 4 x 16
    lay = job.layout
    assert (lay.dp, lay.zero_stage, lay.offload_optimizer, lay.offload_params) == (16, 3, "cpu", "cpu")
    assert (lay.micro_batch, lay.grad_accum, job.global_batch) == (4, 4, 256)
    assert job.precision == "bf16-mixed"


def test_tp_pp_from_the_command_line_set_dp():
    job = layout_from_deepspeed(dict(ZERO3_OFFLOAD, train_batch_size=64), num_gpus=16, tp=2, pp=2)
    assert job.layout.dp == 4  # 16 / (2*2); 64 = 4 x 4 x 4


def test_batch_assertion_as_deepspeed_checks_it():
    # DeepSpeed runtime/config.py _batch_assertion: 256 != 4 * 4 * 8
    with pytest.raises(PlanInputError, match=r"train_batch_size 256 != .* 4 x .* 4 x .* 8"):
        layout_from_deepspeed(ZERO3_OFFLOAD, num_gpus=8)


@pytest.mark.parametrize(
    ("keys", "dp", "expected"),
    [  # DeepSpeed _set_batch_related_parameters, each branch worked by hand
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2}, 8, (64, 2, 4)),  # gas = 64//2//8
        ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 8, (64, 4, 2)),  # micro = 64//8//2
        ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 8, (48, 2, 3)),
        ({"train_batch_size": 64}, 8, (64, 8, 1)),  # gas = 1, micro = 64 // 8
        ({"train_micro_batch_size_per_gpu": 2}, 8, (16, 2, 1)),  # train = 2 * 8, gas = 1
    ],
)
def test_batch_inference_branches(keys, dp, expected):
    job = layout_from_deepspeed(keys, num_gpus=dp)
    assert (job.global_batch, job.layout.micro_batch, job.layout.grad_accum) == expected


def test_indivisible_batch_fails_the_assertion():
    # 100 // 3 // 8 = 4 -> 4 * 3 * 8 = 96 != 100: DeepSpeed's assertion fires, so does ours
    with pytest.raises(PlanInputError, match="100 != "):
        layout_from_deepspeed({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 3}, num_gpus=8)


def test_hf_auto_values_resolved_from_the_job():
    job = layout_from_deepspeed(HF_AUTO, num_gpus=8, micro_batch=2, grad_accum=4, precision="bf16-mixed",
                                hidden_size=4096)
    assert job.global_batch == 2 * 4 * 8  # the HF Trainer's world x micro x gas
    assert job.layout.zero_stage == 2 and job.precision == "bf16-mixed"
    assert job.layout.buffers.allgather_bucket_elements == 200_000_000  # the file's 2e8
    assert job.layout.buffers.reduce_bucket_elements == 4096 * 4096  # "auto" = hidden^2


# transformers src/transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig.
# trainer_config_finalize: reduce_bucket_size = hidden_size * hidden_size; under ZeRO-3 also
# stage3_prefetch_bucket_size = int(0.9 * hidden_size * hidden_size) and
# stage3_param_persistence_threshold = 10 * hidden_size
HF_ZERO3_AUTO = {
    "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9},
}


def test_hf_auto_buckets_for_hidden_4096():
    buffers = layout_from_deepspeed(HF_ZERO3_AUTO, num_gpus=8, hidden_size=4096).layout.buffers
    assert buffers.reduce_bucket_elements == 16_777_216  # 4096 x 4096
    assert buffers.prefetch_bucket_elements == 15_099_494  # int(0.9 x 16,777,216 = 15,099,494.4)
    assert buffers.param_persistence_threshold == 40_960  # 10 x 4096
    assert buffers.max_live_parameters == 1_000_000_000  # the file's 1e9


def test_hf_auto_stage3_keys_unfilled_below_zero3():
    # below ZeRO-3 the Trainer fills only reduce_bucket_size; the stage3_ keys keep the defaults
    config = dict(HF_ZERO3_AUTO, zero_optimization=dict(HF_ZERO3_AUTO["zero_optimization"], stage=2))
    buffers = layout_from_deepspeed(config, num_gpus=8, hidden_size=4096).layout.buffers
    assert buffers.reduce_bucket_elements == 4096 * 4096
    assert (buffers.prefetch_bucket_elements, buffers.param_persistence_threshold) == (50_000_000, 100_000)


def test_user_bucket_sizes_are_read():
    # JSON 2e8 is a float, "300000000" a string: DeepSpeed's pydantic int fields take both
    zero = {"stage": 3, "reduce_bucket_size": 2e8, "allgather_bucket_size": "300000000",
            "stage3_prefetch_bucket_size": 1e7, "stage3_max_live_parameters": 1e8,
            "stage3_param_persistence_threshold": 0}
    buffers = layout_from_deepspeed({"train_batch_size": 8, "zero_optimization": zero}, num_gpus=8).layout.buffers
    assert buffers.model_dump() == {
        "reduce_bucket_elements": 200_000_000, "allgather_bucket_elements": 300_000_000,
        "prefetch_bucket_elements": 10_000_000, "max_live_parameters": 100_000_000,
        "param_persistence_threshold": 0,  # DeepSpeed allows 0 (ge=0): nothing persists
        "ddp_bucket_bytes": 25 * 1024 * 1024,  # not a DeepSpeed key: PyTorch's default
    }


@pytest.mark.parametrize(
    ("zero", "kwargs", "match"),
    [
        ({"reduce_bucket_size": "auto"}, {}, "reduce_bucket_size: \"auto\" needs the model's hidden size"),
        ({"allgather_bucket_size": "auto"}, {"hidden_size": 4096}, "allgather_bucket_size: the HF Trainer fills no"),
        ({"stage3_max_live_parameters": "auto"}, {"hidden_size": 4096}, "stage3_max_live_parameters: the HF"),
        ({"reduce_bucket_size": "5e8"}, {}, "reduce_bucket_size: must be a whole number > 0"),
        ({"reduce_bucket_size": 0}, {}, "reduce_bucket_size: must be a whole number > 0"),
        ({"stage3_max_live_parameters": -1}, {}, "stage3_max_live_parameters: must be a whole number >= 0"),
        ({"stage3_prefetch_bucket_size": 1.5e7 + 0.5}, {}, "stage3_prefetch_bucket_size: must be a whole"),
    ],
)
def test_bad_bucket_sizes(zero, kwargs, match):
    config = {"train_batch_size": 8, "zero_optimization": {"stage": 3, **zero}}
    with pytest.raises(PlanInputError, match=match):
        layout_from_deepspeed(config, num_gpus=8, **kwargs)


def test_hf_auto_without_numbers_names_the_flags():
    with pytest.raises(PlanInputError, match="give --global-batch.*give --micro-batch"):
        layout_from_deepspeed(HF_AUTO, num_gpus=8, precision="bf16-mixed")
    with pytest.raises(PlanInputError, match="give --precision"):
        layout_from_deepspeed(HF_AUTO, num_gpus=8, micro_batch=2, hidden_size=4096)


def test_file_and_flag_disagree():
    with pytest.raises(PlanInputError, match="the file says 4 but --micro-batch says 2"):
        layout_from_deepspeed(ZERO3_OFFLOAD, num_gpus=16, micro_batch=2)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"train_batch_size": 8, "zero_optimization": {"stage": 4}}, "stage: 4"),
        ({"train_batch_size": 8, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "gpu"}}},
         "device: 'gpu'"),
        ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
         "needs zero_stage=3"),
        ({"train_batch_size": 8, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, "both enabled"),
        ({"train_batch_size": "eight"}, "positive integer"),
        ({"gradient_accumulation_steps": 2}, "either train_batch_size"),
    ],
)
def test_bad_configs(config, match):
    with pytest.raises(PlanInputError, match=match):
        layout_from_deepspeed(config, num_gpus=8)


def test_precision_mapping():
    fp16 = layout_from_deepspeed({"train_batch_size": 8, "fp16": {"enabled": True}}, num_gpus=8)
    assert fp16.precision == "zero-fp16"
    plain = layout_from_deepspeed({"train_batch_size": 8}, num_gpus=8)
    assert plain.precision == "fp32"
    fp32_grads = {"train_batch_size": 8, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}
    assert layout_from_deepspeed(fp32_grads, num_gpus=8).precision == "megatron-bf16"
    with pytest.raises(PlanInputError, match="computes in fp16, the file in bf16"):
        layout_from_deepspeed(ZERO3_OFFLOAD, num_gpus=16, precision="zero-fp16")


def test_malformed_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"train_batch_size": 8,\n  "zero_optimization": {stage: 3}}')
    with pytest.raises(PlanInputError, match="malformed JSON at line 2"):
        read_deepspeed_config(path)


# --------------------------------------------------------------------------- writer

LLAMA_7B = ModelSpec(
    name="llama2-7b", num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=11008,
    vocab_size=32000, max_seq_len=4096, mlp="swiglu", norm="rmsnorm", position="rotary",
    tied_embeddings=False, linear_bias=False, dropout=False,
)


def _setup(precision: str, batch: int) -> TrainSetup:
    return TrainSetup(seq_len=4096, global_batch=batch, train_tokens=2e12,
                      precision=get_precision(precision), optimizer=get_optimizer("adamw"))


SMALL_BUFFERS = EngineBuffers(reduce_bucket_elements=200_000_000, allgather_bucket_elements=100_000_000,
                              prefetch_bucket_elements=20_000_000, max_live_parameters=300_000_000,
                              param_persistence_threshold=40_960)


@pytest.mark.parametrize(
    ("layout", "precision"),
    [
        (Layout(dp=64, zero_stage=3, offload_optimizer="nvme", offload_params="nvme", micro_batch=2,
                grad_accum=8, recompute="full"), "zero-fp16"),
        (Layout(tp=2, dp=32, zero_stage=1, micro_batch=1, grad_accum=16), "megatron-bf16"),
        (Layout(dp=8, zero_stage=2, offload_optimizer="cpu", micro_batch=4, grad_accum=1), "bf16-mixed"),
        (Layout(dp=8, micro_batch=1, grad_accum=2), "fp32"),
        (Layout(dp=8, zero_stage=3, micro_batch=1, grad_accum=2, buffers=SMALL_BUFFERS), "bf16-mixed"),
        (Layout(dp=8, zero_stage=2, micro_batch=1, grad_accum=2, buffers=SMALL_BUFFERS), "zero-fp16"),
    ],
)
def test_written_config_reads_back(layout, precision):
    batch = layout.micro_batch * layout.grad_accum * layout.dp
    config = json.loads(json.dumps(deepspeed_config(LLAMA_7B, layout, _setup(precision, batch))))
    # batch arithmetic, checked independently of DeepSpeed: micro x gas x dp
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * \
        config["gradient_accumulation_steps"] * layout.dp == batch
    back = layout_from_deepspeed(config, num_gpus=layout.num_gpus, tp=layout.tp, pp=layout.pp)
    assert back.layout == layout
    assert back.precision == precision


def test_nvme_offload_names_the_path():
    layout = Layout(dp=8, zero_stage=3, offload_optimizer="nvme", offload_params="cpu")
    zero = deepspeed_config(LLAMA_7B, layout, _setup("zero-fp16", 8), nvme_path="/mnt/nvme0")["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/mnt/nvme0"}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    # the buffer sizes the plan assumes (DeepSpeed defaults, zero/config.py): 5e7 prefetch, 1e5 persistence
    assert zero["stage3_prefetch_bucket_size"] == 50_000_000
    assert zero["stage3_param_persistence_threshold"] == 100_000
    assert zero["overlap_comm"] is True  # DeepSpeed's default for stage 3


def test_selective_recompute_has_no_deepspeed_key():
    with pytest.raises(PlanInputError, match="selective has no DeepSpeed config key"):
        deepspeed_config(LLAMA_7B, Layout(dp=8, recompute="selective"), _setup("bf16-mixed", 8))


def test_sections_validate_with_deepspeeds_own_models():
    """DeepSpeed's pydantic models (extra keys forbidden) accept what we write."""
    zero_config = pytest.importorskip("deepspeed.runtime.zero.config")
    precision_config = pytest.importorskip("deepspeed.runtime.precision_config")
    for layout, precision in [
        (Layout(dp=64, zero_stage=3, offload_optimizer="nvme", offload_params="nvme"), "zero-fp16"),
        (Layout(dp=8, zero_stage=2, offload_optimizer="cpu"), "bf16-mixed"),
        (Layout(dp=8, zero_stage=1), "megatron-bf16"),
    ]:
        config = deepspeed_config(LLAMA_7B, layout, _setup(precision, layout.dp))
        zero = zero_config.DeepSpeedZeroConfig(**config["zero_optimization"])
        assert int(zero.stage) == layout.zero_stage
        if layout.zero_stage == 3:
            assert zero.prefetch_bucket_size == 50_000_000  # the stage3_ alias was understood
        if "fp16" in config:
            assert precision_config.DeepSpeedFP16Config(**config["fp16"]).enabled
        if "bf16" in config:
            assert precision_config.DeepSpeedBF16Config(**config["bf16"]).enabled
    # a layout's own bucket sizes, as DeepSpeed's model reads them back
    layout = Layout(dp=8, zero_stage=3, buffers=SMALL_BUFFERS)
    zero = zero_config.DeepSpeedZeroConfig(**deepspeed_config(LLAMA_7B, layout, _setup("bf16-mixed", 8))["zero_optimization"])
    assert (zero.reduce_bucket_size, zero.allgather_bucket_size, zero.prefetch_bucket_size,
            zero.max_live_parameters, zero.param_persistence_threshold) == (
        200_000_000, 100_000_000, 20_000_000, 300_000_000, 40_960)
