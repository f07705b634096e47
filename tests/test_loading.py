"""Loading presets and profiles by name or path, user folders, errors, `--gpu/--gpus` arithmetic."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import yaml

from planner.core.errors import PlanInputError
from planner.io.loading import (
    cluster_for_gpus,
    data_dir,
    list_presets,
    load_cluster,
    load_gpu,
    load_model,
    load_node,
)
from planner.core.spec import ModelSpec

# A small GPU written out by hand for user folders (numbers are arbitrary test inputs).
TOY_GPU = {
    "name": "toy-gpu", "memory_gib": 10, "peak_tflops": {"bf16": 100.0}, "hbm_gb_per_s": 1000,
    "achieved_efficiency": 0.5,
    "sources": {k: "test input" for k in
                ("memory_gib", "peak_tflops", "hbm_gb_per_s", "achieved_efficiency")},
}
TOY_NODE = {
    "name": "toy-node", "gpu": "toy-gpu", "gpus_per_node": 4, "intra_node_gb_per_s": 50,
    "intra_node_latency_us": 2, "pcie_gb_per_s": 16, "cpu_memory_gib": 256,
    "sources": {k: "test input" for k in ("gpus_per_node", "intra_node_gb_per_s",
                                          "intra_node_latency_us", "pcie_gb_per_s",
                                          "cpu_memory_gib")},
}
TOY_CLUSTER = {
    "name": "toy-cluster", "node": "toy-node", "num_nodes": 3, "inter_node_gb_per_s": 25,
    "inter_node_latency_us": 5,
    "sources": {"inter_node_gb_per_s": "test input", "inter_node_latency_us": "test input"},
}
TOY_MODEL = {
    "name": "toy-model", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
    "ffn_hidden_size": 256, "vocab_size": 1000, "max_seq_len": 128,
}


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A `--profiles DIR` with one GPU, node, cluster and model preset of its own."""
    _write(tmp_path / "gpus" / "toy-gpu.yaml", TOY_GPU)
    _write(tmp_path / "nodes" / "toy-node.yaml", TOY_NODE)
    _write(tmp_path / "clusters" / "toy-cluster.yaml", TOY_CLUSTER)
    _write(tmp_path / "toy-model.yaml", TOY_MODEL)
    return tmp_path


# --------------------------------------------------------------------------- finding files


def test_data_dirs_are_the_checkout_or_wheel_folders():
    assert (data_dir("hardware_profiles") / "gpus" / "a100-80gb.yaml").is_file()
    assert (data_dir("model_presets") / "gpt3-175b.yaml").is_file()


def test_list_presets_lists_shipped_and_user_files(user_dir):
    shipped = list_presets()
    assert "a100-80gb" in shipped["gpus"] and "dgx-2" in shipped["nodes"]
    assert "dgx2x32" in shipped["clusters"] and "gpt3-175b" in shipped["models"]
    assert "toy-gpu" not in shipped["gpus"]
    mine = list_presets([user_dir])
    assert "toy-gpu" in mine["gpus"] and "toy-node" in mine["nodes"]
    assert "toy-cluster" in mine["clusters"] and "toy-model" in mine["models"]
    assert mine["models"] == sorted(mine["models"])


def test_user_folder_overrides_a_shipped_name(tmp_path):
    _write(tmp_path / "gpus" / "a100-80gb.yaml", {**TOY_GPU, "name": "a100-80gb"})
    assert load_gpu("a100-80gb", [tmp_path]).memory_gib == 10
    assert load_gpu("a100-80gb").memory_gib == 80


# --------------------------------------------------------------------------- models


def test_load_model_by_name_and_by_path():
    # GPT-3 175B: 96 layers, d_model 12288 (Brown et al. 2020, Table 2.1).
    by_name = load_model("gpt3-175b")
    assert (by_name.num_layers, by_name.hidden_size) == (96, 12288)
    by_path = load_model(str(data_dir("model_presets") / "gpt3-175b.yaml"))
    assert by_path == by_name


def test_load_model_from_user_folder_flat_or_models_subfolder(user_dir, tmp_path):
    assert load_model("toy-model", [user_dir]).hidden_size == 64
    other = tmp_path / "other"
    _write(other / "models" / "toy2.yaml", {**TOY_MODEL, "name": "toy2"})
    assert load_model("toy2", [other]).name == "toy2"


def test_json_path_goes_to_the_hf_config_reader(tmp_path, monkeypatch):
    # Dispatch only: a stand-in reader records what it was called with.
    calls = []
    fake = types.ModuleType("planner.io.hf_config")

    def model_from_hf_config(path):
        calls.append(Path(path))
        return ModelSpec(**TOY_MODEL)

    fake.model_from_hf_config = model_from_hf_config
    monkeypatch.setitem(sys.modules, "planner.io.hf_config", fake)
    config = tmp_path / "config.json"
    config.write_text("{}")
    assert load_model(str(config)).name == "toy-model"
    assert load_model(str(tmp_path)).name == "toy-model"  # a folder holding config.json
    assert calls == [config, config]


def test_unknown_model_lists_the_allowed_names():
    with pytest.raises(PlanInputError, match=r"^model: unknown model 'gpt-5'; allowed: .*gpt3-175b"):
        load_model("gpt-5")


def test_missing_model_file():
    with pytest.raises(PlanInputError, match="model: file not found: .*nowhere.yaml"):
        load_model("nowhere.yaml")


# --------------------------------------------------------------------------- bad files


def test_malformed_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "gpus" / "broken.yaml"
    bad.parent.mkdir()
    bad.write_text("name: broken\nmemory_gib: 10\npeak_tflops: {bf16: [1, 2}\n")
    with pytest.raises(PlanInputError, match=r"broken.yaml: malformed YAML at line 3") as info:
        load_gpu("broken", [tmp_path])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text, what", [("", "empty"), ("- 1\n- 2\n", "a list")])
def test_yaml_that_is_not_a_mapping(tmp_path, text, what):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(PlanInputError, match=f"expected a mapping of fields, the file is {what}"):
        load_gpu(str(path))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"memory_gib": 0}, "memory_gib"),
        ({"memory_gib": -80}, "memory_gib"),
        ({"hbm_gb_per_s": 0}, "hbm_gb_per_s"),
        ({"achieved_efficiency": 1.5}, "achieved_efficiency"),
        ({"memory_gb": 80}, "memory_gb"),  # unknown key
        ({"peak_tflops": {"fp64": 19.5}}, "peak_tflops.fp64"),  # not a known dtype
    ],
)
def test_gpu_schema_errors_name_file_and_field(tmp_path, change, field):
    path = _write(tmp_path / "g.yaml", {**TOY_GPU, **change})
    with pytest.raises(PlanInputError) as info:
        load_gpu(str(path))
    assert str(info.value).startswith(f"{path}: {field}: ")


def test_unknown_key_message(tmp_path):
    path = _write(tmp_path / "g.yaml", {**TOY_GPU, "memory_gb": 80})
    with pytest.raises(PlanInputError, match="memory_gb: unknown key"):
        load_gpu(str(path))


def test_missing_source_is_an_error(tmp_path):
    sources = {k: v for k, v in TOY_GPU["sources"].items() if k != "hbm_gb_per_s"}
    path = _write(tmp_path / "g.yaml", {**TOY_GPU, "sources": sources})
    with pytest.raises(PlanInputError, match="missing a citation for hbm_gb_per_s"):
        load_gpu(str(path))


@pytest.mark.parametrize("change, field", [({"gpus_per_node": 0}, "gpus_per_node"),
                                           ({"pcie_gb_per_s": -1}, "pcie_gb_per_s"),
                                           ({"cpu_memory_gib": -1}, "cpu_memory_gib")])
def test_node_schema_errors(tmp_path, change, field):
    path = _write(tmp_path / "n.yaml", {**TOY_NODE, **change})
    with pytest.raises(PlanInputError, match=f"n.yaml: {field}: "):
        load_node(str(path))


def test_node_naming_an_unknown_gpu(tmp_path):
    _write(tmp_path / "nodes" / "bad-node.yaml", {**TOY_NODE, "name": "bad-node", "gpu": "z100"})
    with pytest.raises(PlanInputError, match=r"bad-node.yaml: gpu: unknown gpu 'z100'; allowed: .*a100-80gb"):
        load_cluster("bad-node", [tmp_path])


def test_cluster_naming_an_unknown_node(tmp_path):
    _write(tmp_path / "clusters" / "c.yaml", {**TOY_CLUSTER, "name": "c", "node": "dgx-9"})
    with pytest.raises(PlanInputError, match=r"c.yaml: node: unknown node 'dgx-9'; allowed: .*dgx-2"):
        load_cluster("c", [tmp_path])


def test_cluster_num_nodes_zero(tmp_path):
    path = _write(tmp_path / "c.yaml", {**TOY_CLUSTER, "num_nodes": 0})
    with pytest.raises(PlanInputError, match="c.yaml: num_nodes: Input should be greater than 0"):
        load_cluster(str(path))


def test_unknown_cluster_lists_clusters_and_nodes():
    with pytest.raises(PlanInputError) as info:
        load_cluster("dgx-z100")
    message = str(info.value)
    assert message.startswith("cluster: unknown cluster 'dgx-z100'")
    assert "dgx2x32" in message and "dgx-a100" in message


def test_unknown_gpu_lists_the_allowed_names():
    with pytest.raises(PlanInputError, match=r"^gpu: unknown gpu 'a100'; allowed: a100-40gb, a100-80gb"):
        load_gpu("a100")


# --------------------------------------------------------------------------- clusters


def test_cluster_by_name_resolves_node_and_gpu():
    cluster = load_cluster("dgx2x32")
    # seed 000 §1: 32 DGX-2 nodes = 512 V100 GPUs
    assert cluster.num_nodes == 32 and cluster.num_gpus == 32 * 16
    assert cluster.node.name == "dgx-2" and cluster.gpu.name == "v100-32gb"


def test_node_name_is_a_one_node_cluster_with_the_clusters_network():
    cluster = load_cluster("dgx-2")
    assert cluster.num_nodes == 1 and cluster.num_gpus == 16
    assert cluster.inter_node_gb_per_s == load_cluster("dgx2x32").inter_node_gb_per_s


def test_user_cluster_by_name_and_by_path(user_dir):
    by_name = load_cluster("toy-cluster", [user_dir])
    assert by_name.num_gpus == 3 * 4 and by_name.gpu.name == "toy-gpu"
    # A path in a user folder finds its node and GPU next to it, without --profiles.
    by_path = load_cluster(str(user_dir / "clusters" / "toy-cluster.yaml"))
    assert by_path == by_name


def test_node_file_path_is_a_one_node_cluster(user_dir):
    cluster = load_cluster(str(user_dir / "nodes" / "toy-node.yaml"))
    assert cluster.num_nodes == 1 and cluster.num_gpus == 4
    assert cluster.inter_node_gb_per_s == 25  # from toy-cluster, which uses toy-node


# --------------------------------------------------------------------------- --gpu / --gpus


def test_cluster_for_gpus_whole_nodes():
    cluster = cluster_for_gpus("a100-80gb", 256)
    assert cluster.node.name == "dgx-a100"
    assert cluster.num_nodes == 256 // 8  # 32 DGX A100 nodes
    assert cluster.num_gpus == 256
    assert cluster.inter_node_gb_per_s == 8 * 200 / 8  # 8 x 200 Gb/s HDR per node
    assert cluster.name == "dgx-a100x32"


def test_cluster_for_gpus_one_full_node():
    cluster = cluster_for_gpus("v100-32gb", 16)
    assert cluster.num_nodes == 1 and cluster.node.gpus_per_node == 16


def test_cluster_for_gpus_less_than_a_node():
    cluster = cluster_for_gpus("h100-sxm", 4)
    assert cluster.num_nodes == 1 and cluster.node.gpus_per_node == 4 and cluster.num_gpus == 4
    assert cluster.node.intra_node_gb_per_s == load_node("dgx-h100").intra_node_gb_per_s


def test_cluster_for_gpus_matches_the_shipped_cluster_file():
    assert cluster_for_gpus("v100-32gb", 512).num_nodes == load_cluster("dgx2x32").num_nodes


def test_cluster_for_gpus_not_a_multiple_of_the_node():
    with pytest.raises(PlanInputError, match=r"^gpus: 12 GPUs is not a multiple of 8 GPUs per dgx-a100 node \(nearest: 8 or 16\)"):
        cluster_for_gpus("a100-80gb", 12)


@pytest.mark.parametrize("gpus", [0, -8])
def test_cluster_for_gpus_needs_a_positive_count(gpus):
    with pytest.raises(PlanInputError, match="gpus: must be a positive number"):
        cluster_for_gpus("a100-80gb", gpus)


def test_cluster_for_gpus_unknown_gpu():
    with pytest.raises(PlanInputError, match="gpu: unknown gpu 'z100'"):
        cluster_for_gpus("z100", 8)


def test_cluster_for_gpus_gpu_without_a_node(tmp_path):
    _write(tmp_path / "gpus" / "toy-gpu.yaml", TOY_GPU)
    with pytest.raises(PlanInputError) as info:
        cluster_for_gpus("toy-gpu", 8, [tmp_path])
    message = str(info.value)
    assert message.startswith("gpu: no node profile uses gpu 'toy-gpu'; GPUs with nodes: ")
    assert "a100-80gb" in message and "v100-32gb" in message


def test_user_node_without_a_cluster_file(tmp_path):
    _write(tmp_path / "gpus" / "toy-gpu.yaml", TOY_GPU)
    _write(tmp_path / "nodes" / "toy-node.yaml", TOY_NODE)
    one = cluster_for_gpus("toy-gpu", 4, [tmp_path])  # one node: the network is not used
    assert one.num_gpus == 4
    with pytest.raises(PlanInputError, match="no cluster file uses node toy-node"):
        cluster_for_gpus("toy-gpu", 8, [tmp_path])


def test_a_folder_named_like_a_preset_does_not_shadow_it(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("planner.io.hf_config")
    fake.model_from_hf_config = lambda path: calls.append(path) or ModelSpec(**TOY_MODEL)
    monkeypatch.setitem(sys.modules, "planner.io.hf_config", fake)
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert load_model("gpt2").hidden_size == 768  # GPT-2 small: d_model 768 (Radford et al. 2019)
    assert calls == []
    assert load_model("./gpt2").name == "toy-model"  # written as a path, the folder is used
    assert calls == [Path("gpt2") / "config.json"]


@pytest.mark.cli
def test_cli_turns_a_loading_error_into_one_line_and_exit_2(zplan):
    result = zplan("fit", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "12")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "zplan: error: gpus: 12 GPUs is not a multiple of 8 GPUs per dgx-a100 node "
        "(nearest: 8 or 16), and more than one node")
