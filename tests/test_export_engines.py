"""The engines' own parsers and validators accept what `zplan export` writes.

- torchrun lines (plain, and the front of the Megatron-LM launch line) go through torch's own
  `torch.distributed.run.get_args_parser()` and `config_from_args` (the LaunchConfig torchrun
  starts the agent with).
- accelerate FSDP2 YAML goes through accelerate's own launch path: `load_config_from_file`,
  `launch_command_parser` + `_validate_launch_command` (config merged into the launch
  arguments), `prepare_multi_gpu_env` (the FSDP_* environment), `FullyShardedDataParallelPlugin()`
  (reads that environment, as `Accelerator()` does in the training script) and, for the process
  layout, torch's `config_from_args` on the arguments accelerate hands to torchrun.
- Megatron-LM's flags: the PyPI package `megatron-core` (0.16.1 checked) ships only
  `megatron/core`, not `megatron/training/arguments.py`, so there is no installable parser;
  tests/test_io_megatron_arguments.py parses them with a transcription of its declarations.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml

from planner.io.export import export_text
from planner.io.loading import load_cluster, load_model
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, TrainSetup

run = pytest.importorskip("torch.distributed.run")
pytestmark = pytest.mark.torch

MASTER = "node0.example"  # what the shell puts in place of $MASTER_ADDR


def _setup(precision: str, batch: int) -> TrainSetup:
    return TrainSetup(seq_len=4096, global_batch=batch, train_tokens=1e9, precision=get_precision(precision),
                      optimizer=get_optimizer("adamw"))


@pytest.fixture
def clean_env(monkeypatch):
    """torchrun's parser takes defaults from PET_* variables, and config_from_args sets
    OMP_NUM_THREADS when absent: keep both out of the test's way."""
    for key in [k for k in os.environ if k.startswith(("PET_", "FSDP_", "ACCELERATE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _shell_words(text: str) -> list[str]:
    """What the shell passes on: line continuations joined, $MASTER_ADDR expanded."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return shlex.split("\n".join(lines).replace("\\\n", "").replace("$MASTER_ADDR", MASTER))


def _torchrun_config(words: list[str]):
    """torch's own parse of `torchrun ARGS`: the LaunchConfig, the command and its arguments."""
    assert words[0] == "torchrun"
    args = run.get_args_parser().parse_args(words[1:])
    return run.config_from_args(args)


@pytest.mark.parametrize(
    ("cluster", "tp", "pp", "dp", "nnodes", "nproc"),
    [
        ("dgx-a100x128", 8, 4, 32, 128, 8),  # 8*4*32 = 1024 GPUs = 128 nodes of 8
        ("dgx-a100x128", 2, 1, 8, 2, 8),  # 16 GPUs = 2 nodes of 8
        ("dgx-a100", 1, 1, 4, 1, 4),  # 4 GPUs on one 8-GPU node
    ],
)
def test_torchrun_line_parsed_by_torch(clean_env, cluster, tp, pp, dp, nnodes, nproc):
    layout = Layout(tp=tp, pp=pp, dp=dp)
    text = export_text("torchrun", load_model("llama2-7b"), load_cluster(cluster), layout,
                       _setup("bf16-mixed", dp))
    config, cmd, cmd_args = _torchrun_config(_shell_words(text))
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (nnodes, nnodes, nproc)
    assert config.min_nodes * config.nproc_per_node == tp * pp * dp
    if nnodes > 1:
        assert (config.rdzv_backend, config.rdzv_endpoint, config.run_id) == ("c10d", f"{MASTER}:29500", "zplan")
    else:
        assert config.rdzv_backend == "static"  # torchrun's default: one node needs no rendezvous
    assert "train.py" in cmd_args


def test_megatron_launch_line_parsed_by_torch(clean_env):
    layout = Layout(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True, recompute="selective")
    text = export_text("megatron", load_model("llama2-7b"), load_cluster("dgx-a100x128"), layout,
                       _setup("megatron-bf16", 16))
    config, _, cmd_args = _torchrun_config(_shell_words(text))
    # 8*4*2 = 64 GPUs = 8 nodes of 8
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (8, 8, 8)
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("c10d", f"{MASTER}:29500")
    # everything after the script went to the script, not to torchrun
    megatron = cmd_args[cmd_args.index("pretrain_gpt.py") + 1:]
    pairs = dict(zip(megatron, megatron[1:]))
    assert pairs["--tensor-model-parallel-size"] == "8" and pairs["--pipeline-model-parallel-size"] == "4"
    assert "--sequence-parallel" in megatron and "--use-distributed-optimizer" in megatron


def test_torchrun_parser_rejects_a_bad_line(clean_env):
    """The check can fail: torch refuses a misspelt flag and an impossible node count."""
    with pytest.raises(SystemExit):
        run.get_args_parser().parse_args(["--gpus-per-node", "8", "train.py"])
    with pytest.raises(AssertionError, match="min_nodes"):
        run.config_from_args(run.get_args_parser().parse_args(["--nnodes", "0", "train.py"]))


# ---------------------------------------------------------------- accelerate FSDP2


def _accelerate_launch(path: Path, *cli: str):
    """Run `accelerate launch --config_file PATH CLI train.py` up to the point where it would
    start torchrun: (merged launch args, environment, FSDP plugin, torch LaunchConfig)."""
    launch = pytest.importorskip("accelerate.commands.launch")
    from accelerate.utils import FullyShardedDataParallelPlugin, patch_environment
    from accelerate.utils.launch import _filter_args, prepare_multi_gpu_env

    args = launch.launch_command_parser().parse_args(["--config_file", str(path), *cli, "train.py"])
    launch._validate_launch_command(args)  # loads the file (load_config_from_file), merges it
    assert args.use_fsdp  # launch_command then calls multi_gpu_launcher(args)
    env = prepare_multi_gpu_env(args)
    with patch_environment(**{k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_"))}):
        plugin = FullyShardedDataParallelPlugin()  # what Accelerator() builds from that environment
    # multi_gpu_launcher hands these arguments to torch.distributed.run.run
    targs = _filter_args(args, run.get_args_parser(),
                         ["--training_script", args.training_script, "--training_script_args", []])
    config, _, _ = run.config_from_args(targs)
    return args, env, plugin, config


def _ignored_keys(path: Path, args, cli: tuple[str, ...]) -> list[str]:
    """Keys of the file whose value did not reach accelerate's merged launch arguments
    (`_validate_launch_command` copies a top-level value only over a None default, and each
    fsdp_config key as it is). Keys given on the command line are the command line's."""
    written = yaml.safe_load(path.read_text())
    given = {word.lstrip("-") for word in cli[::2]}
    ignored = [f"fsdp_config.{key}" for key, value in written.pop("fsdp_config").items()
               if getattr(args, key, None) != value]
    handled_apart = {"compute_environment", "distributed_type"}  # they select the launcher
    return ignored + [key for key, value in written.items()
                      if key not in handled_apart | given and getattr(args, key, None) != value]


def _write(tmp_path: Path, cluster: str, layout: Layout, precision: str) -> Path:
    text = export_text("accelerate-fsdp", load_model("llama2-7b"), load_cluster(cluster), layout,
                       _setup(precision, layout.dp))
    path = tmp_path / "fsdp.yaml"
    path.write_text(text)
    return path


def test_fsdp_yaml_keys_are_accelerates():
    """Every written key is one accelerate reads. Top level: ClusterConfig.from_yaml_file raises
    on unknown keys itself. fsdp_config: accelerate does NOT reject unknown keys there
    (`_validate_launch_command` setattr()s each one onto the launch arguments and
    `prepare_multi_gpu_env` reads only the ones it knows), so this test checks each key against
    the options of accelerate's own launch parser, which is where a known key lands."""
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    launch = pytest.importorskip("accelerate.commands.launch")
    from planner.io.fsdp import accelerate_fsdp_config

    known = {action.dest for action in launch.launch_command_parser()._actions}
    for cluster, layout, precision in [
        ("dgx-a100", Layout(dp=8, zero_stage=3, recompute="full"), "bf16-mixed"),
        ("dgx-a100x128", Layout(dp=16, zero_stage=3, offload_optimizer="cpu", offload_params="cpu"), "zero-fp16"),
    ]:
        written = accelerate_fsdp_config(load_cluster(cluster), layout, _setup(precision, layout.dp))
        assert set(written) <= set(config_args.ClusterConfig.__dataclass_fields__)
        assert set(written["fsdp_config"]) <= known
    assert "fsdp_reshard_after_foward" not in known  # a misspelling would be caught here


@pytest.mark.parametrize(
    ("cluster", "layout", "precision", "nnodes", "nproc"),
    [
        ("dgx-a100", Layout(dp=8, zero_stage=3, recompute="full"), "bf16-mixed", 1, 8),
        ("dgx-a100x128", Layout(dp=16, zero_stage=2), "zero-fp16", 2, 8),  # 16 GPUs = 2 nodes of 8
        ("dgx-a100", Layout(dp=4, zero_stage=3, offload_optimizer="cpu", offload_params="cpu"), "fp32", 1, 4),
    ],
)
def test_fsdp_yaml_through_accelerate_launch(clean_env, tmp_path, cluster, layout, precision, nnodes, nproc):
    from torch.distributed.fsdp import CPUOffloadPolicy

    path = _write(tmp_path, cluster, layout, precision)
    hint = path.read_text().splitlines()[0]
    # machine 1 of 2 launches the way the comment line in the file says
    cli = ("--machine_rank", "1", "--main_process_ip", "10.0.0.1") if nnodes > 1 else ()
    assert all(word in hint for word in cli[::2])
    args, env, plugin, config = _accelerate_launch(path, *cli)

    assert _ignored_keys(path, args, cli) == []  # every written value took effect
    assert (args.num_machines, args.num_processes) == (nnodes, layout.num_gpus)
    assert env["ACCELERATE_MIXED_PRECISION"] == {"bf16-mixed": "bf16", "zero-fp16": "fp16", "fp32": "no"}[precision]
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is (layout.zero_stage == 3)  # ZeRO-3 reshards, ZeRO-2 keeps
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) is (layout.offload_params == "cpu")
    assert plugin.activation_checkpointing is (layout.recompute == "full")
    assert plugin.auto_wrap_policy is not None  # TRANSFORMER_BASED_WRAP resolved to torch's policy

    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (nnodes, nnodes, nproc)
    if nnodes > 1:  # static rendezvous at machine 0, this machine's rank as given
        assert config.rdzv_endpoint == "10.0.0.1:29500" and config.rdzv_configs["rank"] == 1


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda c: c.update(distributed_type="FSPD"), "FSPD"),  # DistributedType enum
        (lambda c: c.update(fsdp_plugin={}), "unknown keys"),  # ClusterConfig.from_yaml_file
        (lambda c: c["fsdp_config"].update(fsdp_reshard_after_forward="sometimes"), "sometimes"),  # str_to_bool
        (lambda c: c.update(mixed_precision="bf17"), "bf17"),  # PrecisionType in prepare_multi_gpu_env
    ],
)
def test_accelerate_rejects_a_broken_file(clean_env, tmp_path, edit, match):
    """The check can fail: accelerate's own code refuses a broken copy of an exported file."""
    path = _write(tmp_path, "dgx-a100", Layout(dp=8, zero_stage=3), "bf16-mixed")
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=match):
        _accelerate_launch(path)


def test_keys_accelerate_ignores_are_caught(clean_env, tmp_path):
    """`rdzv_backend` and `same_network` are ClusterConfig fields (`accelerate config` writes
    them) but `accelerate launch` never applies them from the file: its `--rdzv_backend`
    defaults to "static" and `--same_network` to False, not None. zplan therefore does not
    write them; a file that does is caught by the took-effect check."""
    path = _write(tmp_path, "dgx-a100x128", Layout(dp=16, zero_stage=3), "bf16-mixed")
    config = yaml.safe_load(path.read_text())
    config.update(rdzv_backend="c10d", same_network=True)
    path.write_text(yaml.safe_dump(config))
    cli = ("--machine_rank", "1", "--main_process_ip", "10.0.0.1")
    args, _, _, launch_config = _accelerate_launch(path, *cli)
    assert sorted(_ignored_keys(path, args, cli)) == ["rdzv_backend", "same_network"]
    assert launch_config.rdzv_backend == "static"
