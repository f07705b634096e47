"""The shipped hardware profiles: every file validates, every reference resolves, every number
has a source, and the numbers are the vendor-sheet values (each test cites its sheet)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.io.loading import data_dir, load_cluster, load_gpu, load_node
from planner.core.spec import GIB, ClusterSpec, GpuSpec, NodeSpec

PROFILES = data_dir("hardware_profiles")
KINDS = {"gpus": GpuSpec, "nodes": NodeSpec, "clusters": ClusterSpec}
FILES = [(kind, path) for kind in KINDS for path in sorted((PROFILES / kind).glob("*.yaml"))]


def _ids(item: tuple[str, Path]) -> str:
    return f"{item[0]}/{item[1].stem}"


def test_every_kind_has_files():
    for kind in KINDS:
        assert list((PROFILES / kind).glob("*.yaml")), f"no shipped {kind}"


@pytest.mark.parametrize("item", FILES, ids=_ids)
def test_file_validates_and_is_named_after_its_stem(item):
    kind, path = item
    data = yaml.safe_load(path.read_text())
    spec = KINDS[kind].model_validate(data)
    assert spec.name == path.stem


def _is_number(value) -> bool:
    """YAML 1.1 reads `3.9e9` as a string; pydantic still takes it as a number."""
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("item", FILES, ids=_ids)
def test_every_numeric_field_has_a_source(item):
    # Stricter than the spec's own check: every number written in the file is cited.
    _, path = item
    data = yaml.safe_load(path.read_text())
    numeric = [k for k, v in data.items() if _is_number(v) or isinstance(v, dict)]
    numeric.remove("sources")
    missing = [k for k in numeric if not data["sources"].get(k, "").strip()]
    assert not missing, f"{path.name}: no source for {missing}"


@pytest.mark.parametrize("item", FILES, ids=_ids)
def test_assumed_numbers_say_so(item):
    # A source either names a document (sheet, paper, seed, code) or starts with "assumption".
    _, path = item
    sources = yaml.safe_load(path.read_text())["sources"]
    cited = ("datasheet", "whitepaper", "seed", "paper", "Table", "tuning.cc", "PCIe", "et al.",
             "assumption", "reference architecture", "example size", "a single",
             "github.com/", "nvidia-smi")  # public threads/engine source; the driver's own report
    for key, text in sources.items():
        assert any(word in text for word in cited), f"{path.name}: {key} source cites nothing"


def test_every_node_gpu_and_cluster_node_resolves():
    for path in sorted((PROFILES / "nodes").glob("*.yaml")):
        cluster = load_cluster(path.stem)  # a node name means one node
        assert cluster.num_nodes == 1
        assert cluster.gpu.name == cluster.node.gpu
    for path in sorted((PROFILES / "clusters").glob("*.yaml")):
        spec = ClusterSpec.model_validate(yaml.safe_load(path.read_text()))
        cluster = load_cluster(path.stem)
        assert cluster.node.name == spec.node
        assert cluster.num_gpus == spec.num_nodes * cluster.node.gpus_per_node


def test_every_gpu_default_efficiency_is_in_the_seed_range():
    # seed 004 §1.4: end-to-end GPU utilisation is typically 0.3-0.55. The A100 profiles carry
    # the matmul-level fraction instead, fitted to Narayanan et al. 2021 Table 1 (0.641 by
    # benchmarks/published_runs.py; tests/test_published_runs.py checks the shipped value
    # against the fit), which must lie above the end-to-end 0.52 the same table reports.
    # Issue 10 phase 2: GPUs with an isolated-GEMM table and no in-sample run carry an
    # in-training level TRANSFERRED from A100: A100's fitted level over its best isolated GEMM,
    # 0.641 / 0.869 (a100-80gb.yaml, stas00/ml-engineering MAMF table) = 0.73763, times the
    # GPU's own best isolated bf16 GEMM (H100 SXM 0.803 -> 0.592; RTX 4090 0.998 -> 0.736), which
    # must lie above the GPU's end-to-end utilisation; every other GPU keeps an end-to-end
    # figure in the seed's range.
    ratio = 0.641 / 0.869
    transferred = set()
    for path in sorted((PROFILES / "gpus").glob("*.yaml")):
        gpu = load_gpu(path.stem)
        eff = gpu.achieved_efficiency
        if path.stem.startswith("a100"):
            assert 0.52 < eff <= 1
        elif "TRANSFERRED" in gpu.sources["achieved_efficiency"]:
            transferred.add(path.stem)
            best = max(p.efficiency for p in gpu.gemm_efficiency if p.dtype == "bf16")
            assert eff == pytest.approx(ratio * best, abs=1e-3), path.stem
            assert gpu.end_to_end_utilisation < eff <= 1
        else:
            assert 0.3 <= eff <= 0.55
    assert {"h100-sxm", "h200", "rtx-4090"} <= transferred


# --------------------------------------------------------------------------- GPUs, per datasheet

TFLOP = 1e12


def test_a100_80gb_per_datasheet():
    # NVIDIA A100 Tensor Core GPU datasheet, SXM column, dense (non-sparse) figures.
    gpu = load_gpu("a100-80gb")
    assert gpu.peak_flops_per_s("bf16") == 312 * TFLOP
    assert gpu.peak_flops_per_s("fp16") == 312 * TFLOP
    assert gpu.peak_flops_per_s("tf32") == 156 * TFLOP
    assert gpu.peak_flops_per_s("fp32") == 19.5 * TFLOP
    assert gpu.peak_flops_per_s("int8") == 624 * TFLOP
    assert gpu.memory_bytes == 80 * 2**30  # 80 GB HBM2e = 80 GiB
    assert gpu.hbm_bytes_per_s == 2039e9  # 2,039 GB/s


def test_a100_40gb_per_datasheet():
    # NVIDIA A100 datasheet, A100 40GB SXM: same tensor peaks, 40 GB, 1,555 GB/s.
    gpu = load_gpu("a100-40gb")
    assert gpu.peak_flops_per_s("bf16") == 312 * TFLOP
    assert gpu.peak_flops_per_s("tf32") == 156 * TFLOP
    assert gpu.memory_bytes == 40 * GIB
    assert gpu.hbm_bytes_per_s == 1555e9


@pytest.mark.parametrize("name, gib", [("v100-16gb", 16), ("v100-32gb", 32)])
def test_v100_per_datasheet(name, gib):
    # NVIDIA Tesla V100 datasheet, SXM2: Tensor 125 TFLOPS, single precision 15.7, 900 GB/s.
    gpu = load_gpu(name)
    assert gpu.peak_flops_per_s("fp16") == 125 * TFLOP
    assert gpu.peak_flops_per_s("fp32") == 15.7 * TFLOP
    assert gpu.memory_bytes == gib * GIB
    assert gpu.hbm_bytes_per_s == 900e9
    assert "bf16" not in gpu.peak_tflops  # Volta has no bf16 tensor cores
    with pytest.raises(ValueError, match="bf16"):
        gpu.peak_flops_per_s("bf16")


@pytest.mark.parametrize("name, gib, gb_per_s", [("h100-sxm", 80, 3350), ("h200", 141, 4800)])
def test_hopper_per_datasheet_dense_is_half_the_sparse_figure(name, gib, gb_per_s):
    # NVIDIA H100 / H200 datasheets (SXM) give tensor figures "with sparsity":
    # BF16/FP16 1,979, TF32 989, FP8 3,958 TFLOPS. Dense is half of each. FP32 67.
    gpu = load_gpu(name)
    assert gpu.peak_flops_per_s("bf16") == 1979 / 2 * TFLOP
    assert gpu.peak_flops_per_s("fp16") == 1979 / 2 * TFLOP
    assert gpu.peak_flops_per_s("tf32") == 989 / 2 * TFLOP
    assert gpu.peak_flops_per_s("fp8") == 3958 / 2 * TFLOP
    assert gpu.peak_flops_per_s("fp32") == 67 * TFLOP
    assert gpu.memory_bytes == gib * GIB
    assert gpu.hbm_bytes_per_s == gb_per_s * 1e9  # 3.35 TB/s, 4.8 TB/s


def test_rtx_4090_per_ada_whitepaper():
    # NVIDIA Ada GPU Architecture whitepaper, appendix (RTX 4090), dense / sparse:
    # FP16 tensor with FP32 accumulate 165.2 / 330.3, BF16 165.2 / 330.3, TF32 82.6 / 165.2,
    # FP32 82.6; 24 GB GDDR6X at 21 Gbps x 384 bit / 8 = 1008 GB/s.
    gpu = load_gpu("rtx-4090")
    assert gpu.peak_flops_per_s("fp16") == 165.2 * TFLOP
    assert gpu.peak_flops_per_s("bf16") == 165.2 * TFLOP
    assert gpu.peak_flops_per_s("tf32") == 82.6 * TFLOP
    assert gpu.peak_flops_per_s("fp32") == 82.6 * TFLOP
    assert gpu.memory_bytes == 24 * GIB
    assert gpu.hbm_bytes_per_s == pytest.approx(21e9 * 384 / 8)


# --------------------------------------------------------------------------- nodes and clusters

PCIE3_X16_GB_PER_S = 8 * 16 * 128 / 130 / 8  # 8 GT/s x 16 lanes x 128b/130b / 8 bits = 15.75
PCIE4_X16_GB_PER_S = 16 * 16 * 128 / 130 / 8  # 31.5
PCIE5_X16_GB_PER_S = 32 * 16 * 128 / 130 / 8  # 63.0


def test_dgx2_per_datasheet_and_seed_000():
    # NVIDIA DGX-2 datasheet: 16 x V100 32 GB, NVSwitch 300 GB/s per GPU (both directions),
    # 1.5 TB system memory, 30 TB (8 x 3.84 TB) NVMe, PCIe gen3. Seed 000 §1: 16 GPUs per DGX-2.
    node = load_node("dgx-2")
    assert node.gpu == "v100-32gb"
    assert node.gpus_per_node == 16
    assert node.intra_node_gb_per_s == 300 / 2
    assert node.cpu_memory_bytes == 1536 * GIB
    assert node.nvme_bytes == 8 * 3_840_000_000_000
    assert node.pcie_gb_per_s == pytest.approx(PCIE3_X16_GB_PER_S, abs=0.01)


@pytest.mark.parametrize(
    "name, gpu, nvlink_bidir, cpu_tib, nvme_drives, pcie",
    [
        # DGX A100 datasheet (640 GB): 8 x A100 80GB, NVLink 600 GB/s, 2 TB, 8 x 3.84 TB, gen4
        ("dgx-a100", "a100-80gb", 600, 2, 8, PCIE4_X16_GB_PER_S),
        # DGX A100 datasheet (320 GB): 8 x A100 40GB, 1 TB, 4 x 3.84 TB
        ("dgx-a100-40gb", "a100-40gb", 600, 1, 4, PCIE4_X16_GB_PER_S),
        # DGX H100 datasheet: 8 x H100, NVLink 900 GB/s, 2 TB, 8 x 3.84 TB, gen5
        ("dgx-h100", "h100-sxm", 900, 2, 8, PCIE5_X16_GB_PER_S),
        # DGX H200 datasheet: 8 x H200, NVLink 900 GB/s, 2 TB, 8 x 3.84 TB, gen5
        ("dgx-h200", "h200", 900, 2, 8, PCIE5_X16_GB_PER_S),
    ],
)
def test_dgx_nodes_per_datasheet(name, gpu, nvlink_bidir, cpu_tib, nvme_drives, pcie):
    node = load_node(name)
    assert node.gpu == gpu
    assert node.gpus_per_node == 8
    assert node.intra_node_gb_per_s == nvlink_bidir / 2  # per direction
    assert node.cpu_memory_bytes == cpu_tib * 1024 * GIB
    assert node.nvme_bytes == nvme_drives * 3_840_000_000_000
    assert node.pcie_gb_per_s == pytest.approx(pcie, abs=0.01)


def test_rtx4090_workstation_per_seed_004():
    # seed 004 §3.4.1: RTX 4090 communication ~64 GB/s (both directions, PCIe 4.0 x16), ~10 us.
    node = load_node("rtx4090-x8")
    assert node.gpu == "rtx-4090"
    assert node.intra_node_gb_per_s == pytest.approx(64 / 2, rel=0.02)
    assert node.intra_node_latency_us == 10
    assert node.pcie_gb_per_s == pytest.approx(PCIE4_X16_GB_PER_S, abs=0.01)


@pytest.mark.parametrize(
    "name, gpus, nics, nic_gbit",
    [
        ("dgx2x32", 512, 8, 100),  # seed 000: 32 DGX-2 = 512 V100; DGX-2 sheet: 8 x 100 Gb/s EDR
        ("dgx2", 16, 8, 100),
        ("dgx-a100x128", 1024, 8, 200),  # DGX A100 sheet: 8 x 200 Gb/s HDR
        ("dgx-a100-40gbx32", 256, 8, 200),
        ("dgx-h100x32", 256, 8, 400),  # DGX H100 sheet: 8 x 400 Gb/s NDR
        ("dgx-h200x32", 256, 8, 400),
        ("dgx1x8", 64, 4, 100),  # DGX-1 sheet: 4 x 100 Gb/s EDR
    ],
)
def test_cluster_sizes_and_network(name, gpus, nics, nic_gbit):
    cluster = load_cluster(name)
    assert cluster.num_gpus == gpus
    assert cluster.inter_node_bytes_per_s == nics * nic_gbit * 1e9 / 8  # bits -> bytes
