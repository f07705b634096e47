"""`--gpu NAME --gpus N`: which shipped node type builds the cluster (planner/io/loading.py).

GB200 ships two node types: `gb200-nvl72` (72 GPUs per NVLink domain, NVIDIA's GB200 NVL72
specification) and `gb200-nvl72-seg16` (64-GPU segments, the 16-tray block scheduling NVIDIA
recommends for jobs of 128+ GPUs; both files cite their sources). The expected counts below are
the division done by hand.
"""
import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core.errors import PlanInputError
from planner.io.loading import cluster_for_gpus


def test_128_gb200_are_two_64_gpu_segments():
    # 128 / 72 leaves 56 over; 128 / 64 = 2 whole segments.
    cluster = cluster_for_gpus("gb200", 128)
    assert cluster.name == "gb200-nvl72-seg16x2"
    assert cluster.num_nodes == 2
    assert cluster.node.gpus_per_node == 64


def test_144_gb200_keep_the_first_node_type():
    # 144 / 72 = 2 racks: the first node type (by name) divides it, so it is kept.
    cluster = cluster_for_gpus("gb200", 144)
    assert cluster.name == "gb200-nvl72x2"
    assert cluster.num_nodes == 2


def test_a_count_no_node_type_divides_names_every_size():
    # 100 = 72 + 28 = 64 + 36: neither node type divides it.
    with pytest.raises(PlanInputError) as err:
        cluster_for_gpus("gb200", 100)
    message = str(err.value)
    assert message == ("gpus: 100 GPUs is not a multiple of 72 GPUs per gb200-nvl72 node "
                       "(nearest: 72 or 144); 64 GPUs per gb200-nvl72-seg16 node, and more than one node")


def test_the_cli_refuses_it_with_exit_2_and_one_line():
    result = CliRunner().invoke(app, ["fit", "--model", "llama3-8b", "--gpu", "gb200", "--gpus", "100"])
    assert result.exit_code == 2
    assert "gpus:" in result.output and "Traceback" not in result.output
