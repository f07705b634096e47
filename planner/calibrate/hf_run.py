"""`zplan calibrate --hf-config PATH/config.json`: the user's own transformers model, measured
against the implementation inventory (planner.memory.implementations).

`calibrate_hf(...)` is the whole command minus its CLI wiring: it reads the config (bad input
raises PlanInputError naming the field: the command's exit 2), measures the model at reduced
depth on CPU and at full size on the meta device, and returns the rows; `render(rows)` prints them.
"""

from __future__ import annotations

from pathlib import Path

from planner.calibrate import hf_models
from planner.calibrate.results import HFRow
from planner.calibrate.sdpa_backend import FUSED, backend_name
from planner.core import flops as flops_mod
from planner.core import params
from planner.core.errors import PlanInputError
from planner.io.hf_config import model_from_hf_dict, read_json
from planner.memory import implementations as impls


def implementation_for(config: dict, attention: str, precision: str, device: str,
                       sdpa_backend: str = "flash") -> impls.Implementation:
    """The inventory of a transformers model run with `attention` (eager, sdpa) on `device`
    (cpu: CPU kernels; meta or cuda: CUDA kernels). Defaults as in the configuration classes:
    GPT-2 `activation_function="gelu_new"`, `attn_pdrop=0.1`; Llama family `attention_dropout=0`;
    DeepSeek-V3 router groups from `n_group` / `topk_group` (1 when absent)."""
    gpt2 = config.get("model_type") == "gpt2"
    act = config.get("activation_function", "gelu_new") if gpt2 else config.get("hidden_act", "silu")
    p = config.get("attn_pdrop", 0.1) if gpt2 else config.get("attention_dropout", 0.0)
    return impls.Implementation(name="hf-eager" if attention == "eager" else "hf-sdpa", precision=precision,
                                device="cpu" if device == "cpu" else "cuda",
                                composite_gelu=act == "gelu_new", attention_dropout=bool(p),
                                sdpa_backend=sdpa_backend,
                                router_groups=config.get("n_group") or 1,  # DeepSeek-V3's router
                                router_topk_groups=config.get("topk_group") or 1)


def measure_row(config: dict, attention: str, precision: str, seq_len: int, micro_batch: int,
                layers: int | None, device: str) -> HFRow:
    """Build, measure and predict one (attention, precision, device) combination."""
    spec = model_from_hf_dict(config, name=str(config.get("_name_or_path", "hf-model")))
    model = hf_models.build_model(config, attention, precision, num_layers=layers, device=device)
    got = hf_models.measure(model, seq_len, micro_batch, precision)
    n = got.num_layers
    spec = spec.model_copy(update={"num_layers": n})
    ran = backend_name(got.sdpa_kernels, n) if attention == "sdpa" else ""
    impl = implementation_for(config, attention, precision, device, ran if ran in FUSED else "flash")
    # math or a mix has no inventory of its own: flagged, the fused kernel's shown
    backend_flag = (f"attention backend {ran}: not modelled",) if ran and ran not in FUSED else ()
    block = impls.block_saved_bytes(spec, impl, seq_len, micro_batch)
    outside = impls.hf_outside_saved_bytes(spec, impl, seq_len, micro_batch)
    measured = got.block(0)
    bad = tuple(sorted(k for k in set(block) | set(measured) if block.get(k) != measured.get(k)))
    bad += tuple(sorted(k for k in set(outside) | set(got.outside) if outside.get(k) != got.outside.get(k)))
    bad += backend_flag
    return HFRow(
        where=f"{device}, {n} layers", attention=attention, precision=precision,
        predicted_block_bytes=sum(block.values()), measured_block_bytes=sum(measured.values()),
        predicted_outside_bytes=sum(outside.values()), measured_outside_bytes=sum(got.outside.values()),
        predicted_params=params.count_params(spec).total, measured_params=got.parameters,
        predicted_forward_flops=flops_mod.forward_flops(spec, micro_batch, seq_len),
        measured_forward_flops=got.forward_flops, mismatched_classes=bad, attention_backend=ran)


def calibrate_hf(config_path: str | Path, seq_len: int = 128, micro_batch: int = 2,
                 attention: str = "sdpa", precisions: tuple[str, ...] = ("bf16", "autocast-bf16"),
                 cpu_layers: int = 2, meta: bool = True) -> list[HFRow]:
    """What `zplan calibrate --hf-config` runs: every precision at `cpu_layers` blocks on CPU
    (full width), and the non-autocast precisions at full size on the meta device."""
    path = Path(config_path)
    config = read_json(path / "config.json" if path.is_dir() else path, "hf_config")
    if not hf_models.transformers_available():
        raise PlanInputError("hf_config", hf_models.HF_INSTALL_HINT)
    for field, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("cpu_layers", cpu_layers)):
        if value <= 0:
            raise PlanInputError(field, f"must be a positive integer (got {value})")
    rows = [measure_row(config, attention, p, seq_len, micro_batch, cpu_layers, "cpu") for p in precisions]
    if meta:
        rows += [measure_row(config, attention, p, seq_len, micro_batch, None, "meta")
                 for p in precisions if not p.startswith("autocast")]
    return rows


def render(rows: list[HFRow]) -> str:
    """A plain-text table, one line per row."""
    head = (f"{'where':<18}{'attention':<16}{'precision':<15}{'block pred B':>16}{'block meas B':>16}"
            f"{'err %':>8}{'outside pred B':>17}{'outside meas B':>17}{'params pred':>15}{'params meas':>15}"
            f"  mismatched classes")
    lines = [head]
    for r in rows:
        attention = f"{r.attention} ({r.attention_backend})" if r.attention_backend else r.attention
        lines.append(f"{r.where:<18}{attention:<16}{r.precision:<15}{r.predicted_block_bytes:>16,}"
                     f"{r.measured_block_bytes:>16,}{100 * r.block_error:>8.2f}{r.predicted_outside_bytes:>17,}"
                     f"{r.measured_outside_bytes:>17,}{r.predicted_params:>15,}{r.measured_params:>15,}"
                     f"  {', '.join(r.mismatched_classes) or '-'}")
    return "\n".join(lines)
