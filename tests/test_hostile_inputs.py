"""A corpus of hostile inputs run through the installed `zplan` (issue 14).

Every case must give: the expected exit code (2 = bad input, never 1 and never a crash), exactly
one line on stderr starting `zplan: error:` and naming what is wrong, nothing on stdout, and no
file created or changed in the working directory. The classes (each has several cases): bytes
that are not UTF-8, duplicate keys, alias bombs, non-finite numbers, booleans where integers are
expected, unknown Megatron-LM flags, exported fields the format cannot say, existing output
files, zero divisors, malformed syntax, wrong document shapes, missing files, bad option
values, nesting bombs, unknown keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import run_zplan

pytestmark = pytest.mark.cli

JOB = ("model: gpt2\ncluster: dgx2\nlayout: {tp: 1, pp: 1, dp: 16, zero_stage: 1, micro_batch: 1}\n"
       "setup: {seq_len: 1024, global_batch: 16, train_tokens: 1e9, precision: zero-fp16, optimizer: adam}\n")
MODEL = ("name: tiny\narch: decoder\nnum_layers: 2\nhidden_size: 64\nnum_heads: 4\nffn_hidden_size: 256\n"
         "vocab_size: 1000\nmax_seq_len: 128\nmlp: gelu\nnorm: layernorm\nposition: learned\n"
         "tied_embeddings: true\nlinear_bias: true\nfinal_norm: true\ndropout: false\n")
HF = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
      "intermediate_size": 688, "num_attention_heads": 4, "num_key_value_heads": 4,
      "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 512,
      "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
DS = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
      "zero_optimization": {"stage": 1}}
MEGATRON = ("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
            "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 "
            "--max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 16 "
            "--padded-vocab-size 1024 --bf16\n")
CALIBRATION = "schema_version: 2\nentries: []\n"
BAD_BYTES = b"\xff\xfe\x00 not utf-8 \xc3\x28\n"


def _bomb(levels: int = 9) -> str:
    """The classic billion-laughs document: 9 anchors of 9 aliases each (9**9 leaves)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


@dataclass
class Case:
    name: str
    args: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)
    expect: str = ""
    """A fragment the error line must contain (the field or the problem named)."""
    code: int = 2


def _hf(**changes: object) -> str:
    return json.dumps({**HF, **changes}, indent=1)


def _ds(**changes: object) -> str:
    return json.dumps({**DS, **changes}, indent=1)


CHECK_DS = ["check", "--deepspeed", "ds.json", "--model", "gpt2", "--cluster", "dgx2"]
CHECK_MEGATRON = ["check", "--megatron-args", "run.sh", "--cluster", "dgx2"]
FIT_MODEL = ["fit", "--model", "m.yaml", "--cluster", "dgx2", "--tp", "1"]
FIT_HF = ["fit", "--model", "config.json", "--cluster", "dgx2", "--tp", "1"]

CASES = [
    # ---- bytes that are not UTF-8: every kind of input file
    Case("utf8-job", ["check", "job.yaml"], {"job.yaml": BAD_BYTES}, "not UTF-8"),
    Case("utf8-model-yaml", FIT_MODEL, {"m.yaml": BAD_BYTES}, "not UTF-8"),
    Case("utf8-hf-config", FIT_HF, {"config.json": BAD_BYTES}, "not UTF-8"),
    Case("utf8-megatron", CHECK_MEGATRON, {"run.sh": BAD_BYTES}, "not UTF-8"),
    Case("utf8-deepspeed", CHECK_DS, {"ds.json": BAD_BYTES}, "not UTF-8"),
    Case("utf8-calibration", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--calibration", "c.yaml"],
         {"c.yaml": BAD_BYTES}, "not UTF-8"),
    Case("utf8-job-model-inside", ["check", "job.yaml"],
         {"job.yaml": JOB.replace("gpt2", "m.yaml"), "m.yaml": b"name: \xe9t\xe9\n"}, "not UTF-8"),
    Case("utf8-export-job", ["export", "--format", "deepspeed", "--job", "job.yaml"],
         {"job.yaml": BAD_BYTES}, "not UTF-8"),
    # ---- duplicate keys
    Case("dup-model-key", ["check", "job.yaml"], {"job.yaml": JOB + "model: gpt3-175b\n"}, "'model' given twice"),
    Case("dup-zero-stage", ["check", "job.yaml"],
         {"job.yaml": JOB.replace("zero_stage: 1", "zero_stage: 1, zero_stage: 3")}, "'zero_stage' given twice"),
    Case("dup-model-yaml", FIT_MODEL, {"m.yaml": MODEL + "num_layers: 48\n"}, "'num_layers' given twice"),
    Case("dup-hf-json", FIT_HF, {"config.json": _hf()[:-2] + ',\n "num_hidden_layers": 80\n}'},
         "'num_hidden_layers' given twice"),
    Case("dup-ds-json", CHECK_DS, {"ds.json": _ds()[:-2] + ',\n "train_batch_size": 32\n}'},
         "'train_batch_size' given twice"),
    Case("dup-calibration", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--calibration", "c.yaml"],
         {"c.yaml": CALIBRATION + "entries: []\n"}, "'entries' given twice"),
    Case("dup-nested-setup", ["check", "job.yaml"],
         {"job.yaml": JOB.replace("seq_len: 1024", "seq_len: 1024, seq_len: 2048")}, "'seq_len' given twice"),
    # ---- alias / anchor bombs
    Case("bomb-job", ["check", "job.yaml"], {"job.yaml": _bomb()}, "alias"),
    Case("bomb-model", FIT_MODEL, {"m.yaml": _bomb()}, "alias"),
    Case("bomb-calibration", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--calibration", "c.yaml"],
         {"c.yaml": _bomb()}, "alias"),
    Case("bomb-in-layout", ["check", "job.yaml"], {"job.yaml": _bomb() + JOB}, "alias"),
    Case("bomb-many-aliases", ["check", "job.yaml"],
         {"job.yaml": "x: &x 1\ny: [" + ",".join(["*x"] * 1500) + "]\n"}, "aliases"),
    # ---- non-finite numbers
    Case("nonfinite-inf-tokens", ["check", "job.yaml"], {"job.yaml": JOB.replace("1e9", ".inf")}, "non-finite"),
    Case("nonfinite-nan-tokens", ["check", "job.yaml"], {"job.yaml": JOB.replace("1e9", ".nan")}, "non-finite"),
    Case("nonfinite-inf-model", FIT_MODEL, {"m.yaml": MODEL.replace("max_seq_len: 128", "max_seq_len: -.inf")}, "non-finite"),
    Case("nonfinite-nan-hf", FIT_HF, {"config.json": _hf().replace("1e-05", "NaN")}, "non-finite"),
    Case("nonfinite-infinity-ds", CHECK_DS, {"ds.json": _ds().replace('"train_batch_size": 16', '"train_batch_size": Infinity')},
         "non-finite"),
    Case("nonfinite-huge-float-ds", CHECK_DS, {"ds.json": _ds().replace('"train_batch_size": 16', '"train_batch_size": 1e999')},
         "out of range"),
    Case("nonfinite-cli-tokens", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tokens", "inf"], {}, "tokens"),
    Case("nonfinite-cli-efficiency", ["sweep", "--model", "gpt2", "--cluster", "dgx2", "--efficiency", "nan"], {},
         "efficiency"),
    # ---- booleans where integers are expected
    Case("bool-tp", ["check", "job.yaml"], {"job.yaml": JOB.replace("tp: 1", "tp: true")}, "tp"),
    Case("bool-micro-batch", ["check", "job.yaml"], {"job.yaml": JOB.replace("micro_batch: 1", "micro_batch: true")},
         "micro_batch"),
    Case("bool-seq-len", ["check", "job.yaml"], {"job.yaml": JOB.replace("seq_len: 1024", "seq_len: true")},
         "seq_len"),
    Case("bool-model-layers", FIT_MODEL, {"m.yaml": MODEL.replace("num_layers: 2", "num_layers: true")},
         "num_layers"),
    Case("bool-hf-heads", FIT_HF, {"config.json": _hf(num_attention_heads=True)}, "num_attention_heads"),
    Case("bool-ds-micro", CHECK_DS, {"ds.json": _ds(train_micro_batch_size_per_gpu=True)},
         "train_micro_batch_size_per_gpu"),
    # ---- unknown Megatron-LM flags (typos): refused with the nearest known flag
    Case("megatron-typo-tp", CHECK_MEGATRON,
         {"run.sh": MEGATRON.replace("--tensor-model-parallel-size", "--tensor-model-paralel-size")},
         "did you mean --tensor-model-parallel-size"),
    Case("megatron-typo-layers", CHECK_MEGATRON, {"run.sh": MEGATRON.replace("--num-layers", "--num-layer")},
         "did you mean --num-layers"),
    Case("megatron-typo-hidden", CHECK_MEGATRON, {"run.sh": MEGATRON.replace("--hidden-size", "--hiden-size")},
         "did you mean --hidden-size"),
    Case("megatron-made-up", CHECK_MEGATRON, {"run.sh": MEGATRON.replace("--bf16", "--bf16 --go-faster")},
         "--go-faster"),
    # ---- exported fields the format cannot say: refused, nothing written
    Case("export-ds-sequence-parallel", ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2",
                                         "--tp", "2", "--sequence-parallel", "-o", "out.json"], {}, "sequence_parallel"),
    Case("export-ds-virtual-stages", ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2",
                                      "--pp", "2", "--virtual-stages", "2", "-o", "out.json"], {}, "virtual_stages"),
    Case("export-ds-selective", ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2",
                                 "--recompute", "selective"], {}, "recompute"),
    Case("export-megatron-zero3", ["export", "--format", "megatron", "--model", "gpt2", "--cluster", "dgx2",
                                   "--zero", "3"], {}, "zero_stage"),
    Case("export-fsdp-tp", ["export", "--format", "accelerate-fsdp", "--model", "gpt2", "--cluster", "dgx2",
                            "--tp", "2", "--zero", "3"], {}, "tp"),
    Case("export-ds-sp-stdout", ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2",
                                 "--tp", "4", "--sequence-parallel"], {}, "sequence_parallel"),
    # ---- existing output files: refused without --force, left as they were
    Case("output-export-overwrite", ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2",
                              "--tp", "1", "-o", "mine.json"], {"mine.json": "precious\n"}, "--force"),
    Case("output-sweep-csv-overwrite", ["sweep", "--model", "gpt2", "--cluster", "dgx2", "--csv", "mine.csv"],
         {"mine.csv": "precious\n"}, "--force"),
    Case("output-fit-plot-overwrite", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1", "--plot", "mine.png"],
         {"mine.png": "precious\n"}, "--force"),
    Case("output-is-dir", ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2",
                                  "--tp", "1", "-o", "adir"], {"adir/keep": "x"}, "directory"),
    Case("output-plot-bad-suffix", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1", "--plot", "p.gif"],
         {}, ".png or .svg"),
    Case("output-no-dir", ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2",
                                  "--tp", "1", "-o", "nodir/out.json"], {}, "does not exist"),
    # ---- zero divisors and zero sizes
    Case("zero-heads-fit", FIT_HF, {"config.json": _hf(num_attention_heads=0)}, "num_attention_heads"),
    Case("zero-heads-show", ["show", "config.json"], {"config.json": _hf(num_attention_heads=0)},
         "num_attention_heads"),
    Case("zero-heads-sweep", ["sweep", "--model", "config.json", "--cluster", "dgx2"],
         {"config.json": _hf(num_attention_heads=0)}, "num_attention_heads"),
    Case("zero-heads-infer", ["infer", "--model", "config.json", "--gpu", "a100-80gb"],
         {"config.json": _hf(num_attention_heads=0)}, "num_attention_heads"),
    Case("zero-heads-export", ["export", "--format", "deepspeed", "--model", "config.json", "--cluster", "dgx2"],
         {"config.json": _hf(num_attention_heads=0)}, "num_attention_heads"),
    Case("zero-kv-heads", FIT_HF, {"config.json": _hf(num_key_value_heads=0)}, "num_key_value_heads"),
    Case("zero-hidden", FIT_MODEL, {"m.yaml": MODEL.replace("hidden_size: 64", "hidden_size: 0")},
         "hidden_size"),
    # ---- malformed syntax
    Case("syntax-yaml", ["check", "job.yaml"], {"job.yaml": JOB + "layout: [unclosed\n"}, "malformed YAML"),
    Case("syntax-json-truncated", CHECK_DS, {"ds.json": _ds()[:20]}, "malformed JSON"),
    Case("syntax-calibration", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--calibration", "c.yaml"],
         {"c.yaml": "entries: [\n  {a: 1\n"}, "malformed YAML"),
    Case("syntax-megatron-quote", CHECK_MEGATRON, {"run.sh": MEGATRON + ' --data-path "unclosed\n'},
         "cannot split"),
    Case("syntax-json-trailing-comma", FIT_HF, {"config.json": _hf()[:-2] + ",\n}"}, "malformed JSON"),
    # ---- wrong document shapes
    Case("shape-job-empty", ["check", "job.yaml"], {"job.yaml": ""}, "job"),
    Case("shape-job-list", ["check", "job.yaml"], {"job.yaml": "- model\n- cluster\n"}, "mapping"),
    Case("shape-hf-list", FIT_HF, {"config.json": "[1, 2]"}, "JSON object"),
    Case("shape-ds-string", CHECK_DS, {"ds.json": '"zero"'}, "JSON object"),
    Case("shape-model-scalar", FIT_MODEL, {"m.yaml": "42\n"}, "mapping"),
    # ---- missing files
    Case("missing-job", ["check", "nope.yaml"], {}, "nope.yaml"),
    Case("missing-ds", ["check", "--deepspeed", "nope.json", "--model", "gpt2", "--cluster", "dgx2"], {}, "nope.json"),
    Case("missing-megatron", ["check", "--megatron-args", "nope.sh", "--cluster", "dgx2"], {}, "nope.sh"),
    Case("missing-job-is-dir", ["check", "adir"], {"adir/keep": "x"}, "adir"),
    # ---- bad option values
    Case("cli-zero-5", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--zero", "5"], {}, "--zero"),
    Case("cli-tp-0", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "0"], {}, "--tp"),
    Case("cli-gpus-abc", ["sweep", "--model", "gpt2", "--gpu", "a100-80gb", "--gpus", "abc"], {}, "gpus"),
    Case("cli-precision", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--precision", "fp12"], {}, "precision"),
    Case("cli-unknown-option", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tensor-parallel", "2"], {},
         "--tensor-parallel"),
    Case("cli-tp-not-int", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "two"], {}, "--tp"),
    Case("cli-unknown-model", ["fit", "--model", "gpt5", "--cluster", "dgx2"], {}, "gpt5"),
    Case("cli-format", ["export", "--format", "slurm", "--model", "gpt2", "--cluster", "dgx2"], {}, "format"),
    # ---- nesting bombs
    Case("deep-json", CHECK_DS, {"ds.json": "[" * 200_000 + "]" * 200_000}, "ds.json"),
    Case("deep-yaml", ["check", "job.yaml"], {"job.yaml": "a: " + "[" * 50_000 + "]" * 50_000 + "\n"}, "job.yaml"),
    # ---- integers wider than the int64 columns of the model
    Case("width-layers", FIT_MODEL, {"m.yaml": MODEL.replace("num_layers: 2", "num_layers: " + "9" * 21)},
         "64-bit"),
    Case("width-job-global-batch", ["check", "job.yaml"],
         {"job.yaml": JOB.replace("global_batch: 16", "global_batch: " + "1" * 25)}, "64-bit"),
    # ---- sizes past the model's bounds: in 64 bits, but a hang before (a loop over 1e18 layers)
    Case("huge-layers", FIT_MODEL, {"m.yaml": MODEL.replace("num_layers: 2", "num_layers: 1000000000000000000")},
         "num_layers"),
    Case("huge-context", FIT_MODEL, {"m.yaml": MODEL.replace("max_seq_len: 128", "max_seq_len: 1000000000000")},
         "max_seq_len"),
    Case("huge-sweep-layers", ["sweep", "--model", "m.yaml", "--gpu", "a100-80gb", "--gpus", "8"],
         {"m.yaml": MODEL.replace("num_layers: 2", "num_layers: 1000000000000000000")}, "num_layers"),
    # ---- sizes past the bounds of planner/core/limits.py: a wrapped int64 product, an
    # infinity or an int64 overflow before (session 22: exit 1 with a negative step time, exit 3,
    # or exit 0 with `inf`)
    Case("huge-batch-wrap", ["fit", "--model", "gpt2", "--gpu", "a100-80gb", "--gpus", "1", "--micro-batch",
                             str(2**63 - 1), "--grad-accum", str(2**63 - 1), "--global-batch", "1"], {},
         "micro_batch"),
    Case("huge-batch-product", ["fit", "--model", "gpt2", "--gpu", "a100-80gb", "--gpus", "1", "--micro-batch",
                                "65536", "--grad-accum", "65536", "--global-batch", str(2**32)], {},
         "micro_batch*grad_accum*dp"),
    Case("huge-job-global-batch", ["check", "job.yaml"],
         {"job.yaml": JOB.replace("global_batch: 16", "global_batch: 4611686018427387904")}, "global_batch"),
    Case("huge-virtual-stages", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1",
                                 "--virtual-stages", "1000000"], {}, "virtual_stages"),
    Case("huge-reserve", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1", "--reserve", "1e18"], {},
         "--reserve"),
    Case("huge-job-reserve", ["check", "job.yaml"],
         {"job.yaml": JOB.replace("optimizer: adam}", "optimizer: adam, reserve_gib: 1e300}")}, "reserve_gib"),
    Case("huge-cpu-mem", ["sweep", "--model", "gpt2", "--cluster", "dgx2", "--cpu-mem-gib", "1e300"], {},
         "--cpu-mem-gib"),
    Case("huge-tokens", ["budget", "--model", "gpt2", "--tokens", "1e300", "--json"], {}, "--tokens"),
    Case("tiny-efficiency", ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1", "--efficiency", "1e-300"],
         {}, "--efficiency"),
    Case("tiny-efficiency-zero", ["infer", "--model", "gpt2", "--gpu", "a100-80gb", "--efficiency", "0"], {},
         "--efficiency"),
    Case("huge-params", ["budget", "--params", "1e300", "--tokens", "1e12", "--cluster", "dgx-a100x128", "--json"],
         {}, "--params"),
    Case("tiny-params", ["budget", "--params", "1e-300", "--tokens", "1e12", "--cluster", "dgx-a100x128", "--json"],
         {}, "--params"),
    Case("tiny-mfu", ["budget", "--model", "gpt2", "--tokens", "1e12", "--cluster", "dgx-a100x128", "--mfu",
                      "1e-300", "--json"], {}, "--mfu"),
    Case("huge-gpu-hours", ["budget", "--gpu-hours", "1e300", "--cluster", "dgx-a100x128"], {}, "--gpu-hours"),
    Case("huge-ds-bucket", CHECK_DS, {"ds.json": _ds(zero_optimization={"stage": 3, "reduce_bucket_size": 1e300})},
         "reduce_bucket"),
    # ---- unknown keys
    Case("unknown-job-key", ["check", "job.yaml"], {"job.yaml": JOB + "zero_stage: 3\n"}, "zero_stage"),
    Case("unknown-model-key", FIT_MODEL, {"m.yaml": MODEL + "num_experts_typo: 8\n"}, "num_experts_typo"),
    Case("unknown-layout-key", ["check", "job.yaml"], {"job.yaml": JOB.replace("tp: 1", "tpp: 1")}, "tpp"),
]


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_corpus_is_large_and_every_class_repeats():
    assert len(CASES) >= 80
    assert len({case.name for case in CASES}) == len(CASES)
    classes: dict[str, int] = {}
    for case in CASES:
        prefix = case.name.split("-")[0]
        classes[prefix] = classes.get(prefix, 0) + 1
    assert all(count >= 2 for count in classes.values()), classes


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input_is_one_line_exit_2_nothing_written(case: Case, tmp_path: Path):
    for name, content in case.files.items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    before = _snapshot(tmp_path)
    result = run_zplan(*case.args, cwd=tmp_path)
    lines = result.stderr.splitlines()
    assert result.returncode == case.code, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("zplan: error:"), lines[0]
    assert case.expect in lines[0], lines[0]
    assert result.stdout == ""
    assert _snapshot(tmp_path) == before
