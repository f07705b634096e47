"""Real `transformers` models against planner/memory/implementations.py (and today's `megatron`
inventory, for the gap it leaves).

Families: GPT-2, Llama, Mistral, Qwen2 (GQA, qkv bias), Mixtral, DeepSeek-V3 (multi-head latent
attention, a dense first block; small only, and its block 0 is that dense block; the second
DeepSeek row has qk_nope + qk_rope = v_head_dim, the only MLA shape CPU SDPA runs with its flash
kernel; `full` rows run HF gradient checkpointing). Two sizes each (DeepSeek-V3: small only):
- small: config dicts written here (reduced depth and width), measured on CPU, eager and SDPA,
  fp32 / bf16 / autocast-bf16 (CPU kernels: `device="cpu"` inventories);
- full: the published config.json values (written out below with their model card names),
  measured at full size on the meta device in bf16, eager and SDPA (SDPA run as the CUDA flash
  kernel's aten op; `device="cuda"` inventories). Autocast needs a real device: CPU rows only.

Columns: saved bytes of one block and of the whole forward (blocks + embedding, rotary, final
norm, head, loss), predicted vs measured; the `megatron` inventory's error on the same block;
parameters; forward FLOPs (torch.utils.flop_counter vs planner.core.flops).

    python benchmarks/real_models.py                 # print the table (a few minutes on 2 cores)
    python benchmarks/real_models.py --update-docs   # also write it between the markers in README.md
                                                     # if present, else in docs/implementations.md
    python benchmarks/real_models.py --peak          # the step's peak only (planner/memory/peak.py)

Step peak (issue 11): a full fp32 training step (forward, backward, torch Adam step) of the
harness's own GPT / Llama and of the small transformers models under FakeTensorMode inside
torch's MemTracker, against `planner.memory.peak.step_peak_bytes`. Goal: within 5 %.

Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibrate import hf_models  # noqa: E402
from planner.calibrate.hf_run import implementation_for  # noqa: E402
from planner.core import flops, params  # noqa: E402
from planner.core.errors import PlanInputError  # noqa: E402
from planner.core.spec import Layout  # noqa: E402
from planner.io.hf_config import model_from_hf_dict  # noqa: E402
from planner.memory import activations  # noqa: E402
from planner.memory import implementations as impls  # noqa: E402

SMALL = {  # reduced depth and width; attention dropout 0 so CPU SDPA runs its flash kernel
    "gpt2": dict(model_type="gpt2", n_embd=128, n_head=4, n_layer=2, vocab_size=512, n_positions=256,
                 attn_pdrop=0.0, bos_token_id=0, eos_token_id=0),
    "llama": dict(model_type="llama", hidden_size=128, intermediate_size=352, num_attention_heads=4,
                  num_key_value_heads=4, num_hidden_layers=2, vocab_size=512, max_position_embeddings=256),
    "mistral": dict(model_type="mistral", hidden_size=128, intermediate_size=448, num_attention_heads=8,
                    num_key_value_heads=2, num_hidden_layers=2, vocab_size=512, max_position_embeddings=256,
                    sliding_window=256),
    "qwen2": dict(model_type="qwen2", hidden_size=128, intermediate_size=320, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, vocab_size=512, max_position_embeddings=256),
    "mixtral": dict(model_type="mixtral", hidden_size=128, intermediate_size=224, num_attention_heads=4,
                    num_key_value_heads=2, num_hidden_layers=2, vocab_size=512, num_local_experts=4,
                    num_experts_per_tok=2, max_position_embeddings=256),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=128, intermediate_size=352,
                        moe_intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                        num_hidden_layers=2, vocab_size=512, q_lora_rank=96, kv_lora_rank=64,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=4,
                        num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
                        first_k_dense_replace=1, max_position_embeddings=256),
}
SMALL["deepseek_v3 (dq = dv)"] = SMALL["deepseek_v3"] | {"v_head_dim": 48}
RECOMPUTE_ROWS = ("deepseek_v3", "deepseek_v3 (dq = dv)")
"""Small models also run with full recompute (HF gradient checkpointing)."""
FULL = {  # published config.json values (Hugging Face model cards named in the key)
    "gpt2 (openai-community/gpt2-xl)": dict(model_type="gpt2", n_embd=1600, n_head=25, n_layer=48,
                                            vocab_size=50257, n_positions=1024),
    "llama (meta-llama/Llama-2-7b-hf)": dict(model_type="llama", hidden_size=4096, intermediate_size=11008,
                                             num_attention_heads=32, num_key_value_heads=32,
                                             num_hidden_layers=32, vocab_size=32000,
                                             max_position_embeddings=4096),
    "mistral (mistralai/Mistral-7B-v0.1)": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336,
                                                num_attention_heads=32, num_key_value_heads=8,
                                                num_hidden_layers=32, vocab_size=32000, sliding_window=4096,
                                                max_position_embeddings=32768),
    "qwen2 (Qwen/Qwen2-7B)": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                                  num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=28,
                                  vocab_size=152064, max_position_embeddings=131072),
    "mixtral (mistralai/Mixtral-8x7B-v0.1)": dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336,
                                                  num_attention_heads=32, num_key_value_heads=8,
                                                  num_hidden_layers=32, vocab_size=32000, num_local_experts=8,
                                                  num_experts_per_tok=2, max_position_embeddings=32768),
}
FULL["deepseek-v3 (deepseek-ai/DeepSeek-V3)"] = {  # tests/data/hf_configs/deepseek-v3.json, the
    # model card's config.json; eager only (dq 192 != dv 128: no flash kernel, hf-sdpa not modelled)
    k: v for k, v in json.loads((ROOT / "tests/data/hf_configs/deepseek-v3.json").read_text()).items()
    if k not in ("quantization_config", "auto_map", "architectures")}
EAGER_ONLY = ("deepseek-v3 (deepseek-ai/DeepSeek-V3)",)
SMALL_SEQ, SMALL_BATCH = 128, 2
FULL_BATCH = 1
MARK_START, MARK_END = "<!-- real-models:start -->", "<!-- real-models:end -->"


def _full_seq(name: str) -> int:
    return 1024 if name.startswith("gpt2") else 4096


def _megatron_error(spec, attention: str, precision: str, seq: int, batch: int, measured: int) -> str:
    """Today's inventory (activations.layer_saved_bytes) on the same block (block 0), 16-bit or fp32."""
    e = 4 if precision == "fp32" else 2
    try:
        got = activations.layer_saved_bytes(spec, Layout(flash_attention=attention == "sdpa"), seq, batch, e,
                                            moe=spec.layer_is_moe(0))
    except PlanInputError:
        return "n/a"
    return f"{100 * (sum(got.values()) / measured - 1):+.1f}"


def row(name: str, config: dict, attention: str, precision: str, device: str, seq: int, batch: int,
        recompute: str = "none") -> list[str]:
    spec = model_from_hf_dict(config, name=name)
    started = time.perf_counter()
    model = hf_models.build_model(config, attention, precision, device=device)
    if recompute == "full":
        model.gradient_checkpointing_enable()
    got = hf_models.measure(model, seq, batch, precision, flops=False)
    impl = implementation_for(config, attention, precision, device).model_copy(update={"recompute": recompute})
    measured_block = sum(got.block(0).values())
    measured_total = got.total_bytes()
    try:
        block = sum(impls.block_saved_bytes(spec, impl, seq, batch, moe=spec.layer_is_moe(0)).values())
        total = impls.model_saved_bytes(spec, impl, seq, batch)
        pred = [f"{block:,}", f"{100 * (block / measured_block - 1):+.2f}", f"{total:,}",
                f"{100 * (total / measured_total - 1):+.2f}"]
    except PlanInputError as err:
        pred = ["not modelled", "", "", f"({err.message[:40]})"]
    where = f"{device}, {got.num_layers} L, s={seq}, b={batch}" + (", full recompute‡" if recompute == "full" else "")
    return [name, where, attention, precision,
            f"{measured_block:,}", *pred[:2], f"{measured_total:,}", *pred[2:],
            _megatron_error(spec, attention, precision, seq, batch, measured_block),
            "exact" if params.count_params(spec).total == got.parameters else
            f"{params.count_params(spec).total:,} vs {got.parameters:,}",
            f"{100 * (flops.forward_flops(spec, batch, seq) / got.forward_flops - 1):+.2f}"
            + ("*" if device == "cpu" and attention == "sdpa" else "") + ("†" if spec.is_moe else ""),
            f"{time.perf_counter() - started:.1f}"]


HEADER = ["model", "where", "attention", "precision", "block measured B", "block predicted B", "err %",
          "forward measured B", "forward predicted B", "err %", "megatron inventory err %", "params",
          "fwd FLOPs err %", "s"]


def table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
    lines.append("\\* CPU SDPA runs `aten._scaled_dot_product_flash_attention_for_cpu`, which "
                 "torch.utils.flop_counter has no formula for: the measured FLOPs leave out QKᵀ and PV.")
    lines.append("‡ full recompute (HF gradient checkpointing): the blocks' cos and sin are no longer recorded by the "
                 "saved-tensor hooks (they reach the checkpointed blocks as arguments, held by the checkpoint rather "
                 "than saved by an autograd node; our reading, not traced further), so the measured forward lacks "
                 "`rotary.cos_sin` (2·s·qk_rope·resid bytes: 16,384 B in fp32) that the prediction keeps: the "
                 "+0.9 to +1.4 % of those rows. Their \"megatron inventory err %\" compares with the no-recompute "
                 "inventory.")
    lines.append("† transformers runs Mixtral's experts with `torch._grouped_mm`, which flop_counter "
                 "(torch 2.13) does not count: the measured FLOPs leave out the experts.")
    return "\n".join(lines)


def run(quick: bool) -> list[list[str]]:
    rows = []
    for name, config in SMALL.items():
        for attention in ("eager", "sdpa"):
            for precision in ("fp32", "bf16", "autocast-bf16"):
                rows.append(row(name, config, attention, precision, "cpu", SMALL_SEQ, SMALL_BATCH))
                print(" | ".join(rows[-1]), flush=True)
    for name in RECOMPUTE_ROWS:
        for precision in ("fp32", "bf16", "autocast-bf16"):
            rows.append(row(name, SMALL[name], "eager", precision, "cpu", SMALL_SEQ, SMALL_BATCH, "full"))
            print(" | ".join(rows[-1]), flush=True)
    if quick:
        return rows
    for name, config in FULL.items():
        for attention in ("eager",) if name in EAGER_ONLY else ("eager", "sdpa"):
            rows.append(row(name, config, attention, "bf16", "meta", _full_seq(name), FULL_BATCH))
            print(" | ".join(rows[-1]), flush=True)
    return rows


PEAK_HEADER = ["model", "implementation", "seq x batch", "Adam", "moment", "peak predicted B",
               "MemTracker peak B", "err %"]
HARNESS_PEAK = [  # (preset, dims, seq, batch): activation-bound and optimizer-bound shapes
    ("gpt2", dict(layers=2, hidden=64, heads=4, ffn=256, vocab=512), 32, 4),
    ("gpt2", dict(layers=2, hidden=128, heads=4, ffn=512, vocab=256), 8, 1),
    ("llama2-7b", dict(layers=2, hidden=64, heads=4, ffn=256, vocab=512), 32, 4),
    ("llama2-7b", dict(layers=2, hidden=128, heads=4, ffn=512, vocab=256), 8, 1),
]


def peak_row(model: str, impl: str, seq: int, batch: int, optimizer: str, measured: int,
             predicted: dict[str, int]) -> list[str]:
    moment = "backward start" if predicted["peak"] == predicted["backward_start"] else "optimizer step"
    err = (predicted["peak"] - measured) / measured * 100
    return [model, impl, f"{seq} x {batch}", optimizer, moment, f"{predicted['peak']:,}", f"{measured:,}",
            f"{err:+.3f}"]


def peak_rows() -> list[list[str]]:
    import torch

    from planner.calibrate import peak_check as pc
    from planner.calibrate.config import scaled_model
    from planner.calibrate.models import build_model
    from planner.io.loading import load_model

    rows = []
    for preset, dims, seq, batch in HARNESS_PEAK:
        spec = scaled_model(load_model(preset), **dims)
        with torch.device("meta"):
            net = build_model(spec, seq)
        for foreach in (True, False):
            opt = "foreach" if foreach else "for-loop"
            measured = pc.tracked_peak(pc.harness_builder(spec, seq, batch), foreach)["Total"]
            predicted = pc.fp32_adam_prediction(net, pc.harness_saved_bytes(spec, seq, batch), seq * batch,
                                                spec.vocab_size, opt)
            rows.append(peak_row(spec.name, "zplan harness", seq, batch, opt, measured, predicted))
            print(" | ".join(rows[-1]), flush=True)
    for name in ("gpt2", "llama", "qwen2"):
        config = SMALL[name]
        for attention in ("eager", "sdpa"):
            for seq, batch in ((SMALL_SEQ, SMALL_BATCH), (8, 1)):
                measured = pc.tracked_peak(pc.hf_builder(config, attention, seq, batch), True)["Total"]
                net = hf_models.build_model(config, attention, "fp32", device="meta")
                predicted = pc.fp32_adam_prediction(net, pc.hf_saved_bytes(config, attention, seq, batch),
                                                    seq * batch, config["vocab_size"], "foreach")
                rows.append(peak_row(name, f"hf-{attention}", seq, batch, "foreach", measured, predicted))
                print(" | ".join(rows[-1]), flush=True)
    return rows


def peak_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(PEAK_HEADER) + " |", "|" + "---|" * len(PEAK_HEADER)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def update(text: str) -> Path:
    readme, doc = ROOT / "README.md", ROOT / "docs" / "implementations.md"
    target = readme if MARK_START in readme.read_text() else doc
    body = target.read_text()
    pattern = re.compile(re.escape(MARK_START) + ".*?" + re.escape(MARK_END), re.S)
    target.write_text(pattern.sub(lambda m: f"{MARK_START}\n{text}\n{MARK_END}", body))
    return target


COMPILE_HEADER = ["model", "precision", "seq x batch", "hf-sdpa inventory B", "eager measured B",
                  "compiled measured B", "compiled vs inventory %", "compile s"]


def compile_rows(names=("gpt2", "llama", "qwen2"), precisions=("fp32", "bf16", "autocast-bf16")) -> list[list[str]]:
    """Saved activations of torch.compile(model) (Inductor, CPU) against the hf-sdpa inventory
    and the eager model (planner.calibrate.compiled)."""
    from planner.calibrate.compiled import compiled_saved, measure_saved

    rows = []
    for name in names:
        config = SMALL[name]
        spec = model_from_hf_dict(config, name=name)
        for precision in precisions:
            model = hf_models.build_model(config, "sdpa", precision, device="cpu")
            impl = implementation_for(config, "sdpa", precision, "cpu")
            predicted = impls.model_saved_bytes(spec, impl, SMALL_SEQ, SMALL_BATCH)
            eager = sum(measure_saved(model, SMALL_SEQ, SMALL_BATCH, precision).values())
            started = time.perf_counter()
            compiled = sum(compiled_saved(model, SMALL_SEQ, SMALL_BATCH, precision).values())
            rows.append([name, precision, f"{SMALL_SEQ} x {SMALL_BATCH}", f"{predicted:,}", f"{eager:,}",
                         f"{compiled:,}", f"{100 * (predicted / compiled - 1):+.1f}",
                         f"{time.perf_counter() - started:.0f}"])
            print(" | ".join(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-docs", action="store_true")
    parser.add_argument("--quick", action="store_true", help="CPU rows only")
    parser.add_argument("--peak", action="store_true", help="the step-peak table only")
    parser.add_argument("--compile", action="store_true", help="the torch.compile table only")
    args = parser.parse_args()
    if args.compile:
        rows = compile_rows()
        print("\n".join(["| " + " | ".join(COMPILE_HEADER) + " |", "|" + "---|" * len(COMPILE_HEADER)]
                        + ["| " + " | ".join(r) + " |" for r in rows]))
        return
    if args.peak:
        print(peak_table(peak_rows()))
        return
    text = table(run(args.quick))
    print(text)
    if args.update_docs:
        print(f"written to {update(text)}")


if __name__ == "__main__":
    main()
