"""The `zplan check` job file: round trip, defaults, and one-line errors naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.core.errors import PlanInputError
from planner.io.jobfile import JobFile, default_grad_accum, load_job, make_setup
from planner.io.loading import load_cluster, load_model
from planner.core.recipes import PRECISIONS

# The example of docs/hardware.md, written as a user would type it (300e9 is a YAML string).
EXAMPLE = """\
model: gpt3-175b
cluster: dgx2x32
layout: {tp: 8, pp: 8, dp: 8, zero_stage: 1, micro_batch: 1, recompute: full}
setup: {seq_len: 2048, global_batch: 1536, train_tokens: 300e9, precision: zero-fp16, optimizer: adam}
"""


def _job(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _job_with(tmp_path: Path, **sections) -> Path:
    data = yaml.safe_load(EXAMPLE)
    data.update(sections)
    return _job(tmp_path, yaml.safe_dump(data))


def test_example_job_loads(tmp_path):
    model, cluster, layout, setup = load_job(_job(tmp_path, EXAMPLE))
    assert model == load_model("gpt3-175b")
    assert cluster == load_cluster("dgx2x32") and cluster.num_gpus == 512  # 32 DGX-2 x 16
    assert (layout.tp, layout.pp, layout.dp, layout.zero_stage) == (8, 8, 8, 1)
    assert layout.recompute == "full"
    assert layout.grad_accum == 1536 // (1 * 8)  # global_batch / (micro_batch x dp) = 192
    assert setup.seq_len == 2048 and setup.global_batch == 1536
    assert setup.train_tokens == 300e9  # the string "300e9" read as a number
    assert setup.precision == PRECISIONS["zero-fp16"]
    assert setup.optimizer.name == "adam"


def test_jobfile_round_trip(tmp_path):
    # parse -> dump -> write -> load gives the same four inputs
    first = JobFile.model_validate(yaml.safe_load(EXAMPLE))
    again = _job(tmp_path, yaml.safe_dump(first.model_dump()), "again.yaml")
    assert JobFile.model_validate(yaml.safe_load(again.read_text())) == first
    assert load_job(again) == load_job(_job(tmp_path, EXAMPLE))


def test_inline_model_and_gpu_count_cluster(tmp_path):
    model = {"name": "tiny", "num_layers": 4, "hidden_size": 256, "num_heads": 4,
             "ffn_hidden_size": 1024, "vocab_size": 32000, "max_seq_len": 1024}
    path = _job_with(
        tmp_path, model=model, cluster={"gpu": "a100-80gb", "gpus": 16},
        layout={"tp": 2, "dp": 8, "micro_batch": 4},
        setup={"seq_len": 1024, "global_batch": 64, "train_tokens": 1e9},
    )
    got_model, cluster, layout, setup = load_job(path)
    assert got_model.hidden_size == 256
    assert cluster.num_nodes == 16 // 8 and cluster.node.name == "dgx-a100"
    assert layout.grad_accum == 64 // (4 * 8)  # = 2
    assert setup.precision.name == "zero-fp16" and setup.optimizer.name == "adam"  # defaults


def test_model_path_is_relative_to_the_job_file(tmp_path):
    sub = tmp_path / "jobs"
    sub.mkdir()
    (sub / "mine.yaml").write_text(yaml.safe_dump(load_model("gpt2").model_dump()))
    data = yaml.safe_load(EXAMPLE)
    data["model"] = "mine.yaml"
    path = _job(sub, yaml.safe_dump(data))
    assert load_job(path)[0] == load_model("gpt2")


def test_explicit_grad_accum_must_match_the_global_batch(tmp_path):
    path = _job_with(tmp_path, layout={"tp": 8, "pp": 8, "dp": 8, "grad_accum": 100})
    with pytest.raises(PlanInputError) as info:
        load_job(path)
    message = str(info.value)
    # 1 x 8 x 100 = 800 != 1536
    assert message.startswith(f"{path}: layout.grad_accum: micro_batch (1) x dp (8) x grad_accum (100) = 800")
    assert "setup.global_batch (1536)" in message


def test_grad_accum_that_does_not_divide_prints_every_factor(tmp_path):
    path = _job_with(tmp_path, layout={"tp": 8, "pp": 8, "dp": 7, "micro_batch": 2})
    with pytest.raises(PlanInputError) as info:
        load_job(path)
    # 1536 / (2 x 7 = 14) = 109.71..., not whole
    assert str(info.value) == (
        f"{path}: layout.grad_accum: global_batch (1536) is not divisible by micro_batch (2) x "
        "dp (7) = 14; change one of them or give grad_accum")


def test_default_grad_accum_arithmetic():
    assert default_grad_accum(1536, 1, 8) == 192  # 1536 / 8
    assert default_grad_accum(512, 4, 16) == 8  # 512 / 64
    with pytest.raises(PlanInputError, match="global_batch \\(10\\)"):
        default_grad_accum(10, 1, 4)


def test_layout_buffers_from_yaml(tmp_path):
    # YAML 1.1 reads 2e8 as the string "2e8" (no dot); the layout takes it as 200,000,000 elements
    text = EXAMPLE.replace("recompute: full}", "recompute: full, buffers: {reduce_bucket_elements: 2e8}}")
    assert "2e8" in text and yaml.safe_load(text)["layout"]["buffers"]["reduce_bucket_elements"] == "2e8"
    _, _, layout, _ = load_job(_job(tmp_path, text))
    assert layout.buffers.reduce_bucket_elements == 200_000_000
    assert layout.buffers.max_live_parameters == 1_000_000_000  # DeepSpeed's default stays


@pytest.mark.parametrize(
    "sections, expected",
    [
        ({"layout": {"tp": 8, "buffers": {"reduce_bucket_elements": 0}}},
         "layout.buffers.reduce_bucket_elements: Input should be greater than 0"),
        ({"layout": {"tp": 8, "buffers": {"reduce_bucket_size": 5}}},
         "layout.buffers.reduce_bucket_size: unknown key"),
        ({"layout": {"tp": 8, "buffers": {"max_live_parameters": "many"}}},
         "layout.buffers.max_live_parameters: "),
        ({"layout": {"tp": 0}}, "layout.tp: Input should be greater than 0"),
        ({"layout": {"tp": 8, "zero": 3}}, "layout.zero: unknown key (not allowed)"),
        ({"layout": {"tp": 8, "zero_stage": 4}}, "layout.zero_stage: "),
        ({"setup": {"seq_len": 0, "global_batch": 8, "train_tokens": 1e9}},
         "setup.seq_len: Input should be greater than 0"),
        ({"setup": {"seq_len": 2048, "global_batch": 8, "train_tokens": "lots"}},
         "setup.train_tokens: "),
        ({"setup": {"seq_len": 2048, "global_batch": 8, "train_tokens": -1}},
         "setup.train_tokens: Input should be greater than 0"),
        ({"setup": {"seq_len": 2048, "global_batch": 1536, "train_tokens": 1e9,
                    "precision": "fp12"}}, "setup.precision: unknown recipe 'fp12'; allowed: "),
        ({"setup": {"seq_len": 2048, "global_batch": 1536, "train_tokens": 1e9,
                    "optimizer": "lion"}}, "setup.optimizer: unknown optimizer 'lion'"),
        ({"model": "gpt-5"}, "model: unknown model 'gpt-5'; allowed: "),
        ({"model": 7}, "model: must be a name, a path or a mapping"),
        ({"model": {"name": "x", "num_layers": 2, "hidden_size": -4, "num_heads": 1,
                    "ffn_hidden_size": 4, "vocab_size": 10, "max_seq_len": 8}},
         "model.hidden_size: Input should be greater than 0"),
        ({"cluster": "nope"}, "cluster: unknown cluster 'nope'"),
        ({"cluster": {"gpu": "a100-80gb", "gpus": 12}}, "cluster.gpus: 12 GPUs is not a multiple of 8"),
        ({"cluster": {"gpu": "a100", "gpus": 8}}, "cluster.gpu: unknown gpu 'a100'"),
        ({"cluster": {"gpu": "a100-80gb", "count": 8}}, "cluster.gpus: Field required"),
        ({"extra": 1}, "extra: unknown key (not allowed)"),
    ],
)
def test_errors_name_the_job_file_and_the_field(tmp_path, sections, expected):
    path = _job_with(tmp_path, **sections)
    with pytest.raises(PlanInputError) as info:
        load_job(path)
    assert str(info.value).startswith(f"{path}: {expected}")
    assert "\n" not in str(info.value)


def test_missing_section(tmp_path):
    path = _job(tmp_path, "model: gpt2\ncluster: dgx-a100\nlayout: {}\n")
    with pytest.raises(PlanInputError, match=r"job.yaml: setup: Field required"):
        load_job(path)


def test_malformed_job_file_names_the_line(tmp_path):
    path = _job(tmp_path, "model: gpt2\ncluster: dgx-a100\nlayout: {tp: 8\nsetup: {}\n")
    with pytest.raises(PlanInputError, match=r"job.yaml: malformed YAML at line \d"):
        load_job(path)


def test_missing_job_file(tmp_path):
    with pytest.raises(PlanInputError, match="job: file not found: .*absent.yaml"):
        load_job(tmp_path / "absent.yaml")


def test_make_setup_reads_numbers_written_as_strings():
    setup = make_setup(2048, 1536, "300e9", "bf16-mixed", "adamw")
    assert setup.train_tokens == 300e9
    assert setup.precision.name == "bf16-mixed" and setup.optimizer.name == "adamw"
    with pytest.raises(PlanInputError, match="^seq_len: Input should be greater than 0"):
        make_setup(0, 8, 1e9)
    with pytest.raises(PlanInputError, match="^precision: unknown recipe"):
        make_setup(2048, 8, 1e9, "fp12")
