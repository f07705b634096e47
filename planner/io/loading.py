"""Load model presets and hardware profiles (YAML) by name or path into typed specs.

Shipped data lives in `hardware_profiles/{gpus,nodes,clusters}/` and `model_presets/` at the
repository root, and inside an installed wheel at `planner/_data/...` (pyproject force-include).
Users add their own folders with `extra_dirs` (the CLI's `--profiles DIR`); those are searched
first, with the same layout (`DIR/gpus/`, `DIR/nodes/`, `DIR/clusters/`), and model presets
either directly in `DIR/` or in `DIR/models/` or `DIR/model_presets/`.

A name is a file stem (`a100-80gb`); anything ending in `.yaml`, `.yml` or `.json`, or containing
a path separator, is a path. Every problem raises a one-line `PlanInputError`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from planner.core.errors import PlanInputError, format_validation_error
from planner.core.spec import Cluster, ClusterSpec, GpuSpec, ModelSpec, NodeSpec
from planner.memory.host import partial_node

HardwareKind = Literal["gpus", "nodes", "clusters"]
PresetKind = Literal["models", "gpus", "nodes", "clusters"]
_SUFFIXES = (".yaml", ".yml")
_PATH_SUFFIXES = (".yaml", ".yml", ".json")
_FIELD = {"models": "model", "gpus": "gpu", "nodes": "node", "clusters": "cluster"}

SpecT = TypeVar("SpecT", bound=BaseModel)


# --------------------------------------------------------------------------- where files are


def data_dir(kind: Literal["hardware_profiles", "model_presets"]) -> Path:
    """The shipped folder: `planner/_data/<kind>` in a wheel, `<repo>/<kind>` in a checkout."""
    package = Path(__file__).resolve().parents[1]  # planner/ (this file is planner/io/loading.py)
    for candidate in (package / "_data" / kind, package.parent / kind):
        if candidate.is_dir():
            return candidate
    raise PlanInputError(kind, f"data folder not found next to {package} (broken install?)")


def _search_dirs(kind: PresetKind, extra_dirs: Sequence[Path]) -> list[Path]:
    """Folders holding files of one kind, user folders first, then the shipped one."""
    dirs: list[Path] = []
    for extra in map(Path, extra_dirs):
        if kind == "models":
            dirs += [extra, extra / "models", extra / "model_presets"]
        else:
            dirs.append(extra / kind)
    if kind == "models":
        dirs.append(data_dir("model_presets"))
    else:
        dirs.append(data_dir("hardware_profiles") / kind)
    return [d for d in dirs if d.is_dir()]


def _named_files(kind: PresetKind, extra_dirs: Sequence[Path]) -> dict[str, Path]:
    """Name -> file for every YAML of one kind; earlier folders win."""
    files: dict[str, Path] = {}
    for folder in _search_dirs(kind, extra_dirs):
        for path in sorted(folder.iterdir()):
            if path.suffix in _SUFFIXES and path.is_file():
                files.setdefault(path.stem, path)
    return files


def list_presets(extra_dirs: Sequence[Path] = ()) -> dict[str, list[str]]:
    """Every loadable name: {"models": [...], "gpus": [...], "nodes": [...], "clusters": [...]}."""
    kinds: tuple[PresetKind, ...] = ("models", "gpus", "nodes", "clusters")
    return {kind: sorted(_named_files(kind, extra_dirs)) for kind in kinds}


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(_PATH_SUFFIXES) or "/" in name_or_path or "\\" in name_or_path


def _find(kind: PresetKind, name: str, extra_dirs: Sequence[Path]) -> Path:
    """The file of a named preset, or an error listing the allowed names."""
    files = _named_files(kind, extra_dirs)
    if name not in files:
        allowed = ", ".join(sorted(files)) or "(none)"
        raise PlanInputError(_FIELD[kind], f"unknown {_FIELD[kind]} {name!r}; allowed: {allowed}")
    return files[name]


def _existing_file(path: Path, field: str) -> Path:
    if not path.is_file():
        raise PlanInputError(field, f"file not found: {path}")
    return path


# --------------------------------------------------------------------------- reading


def read_yaml_mapping(path: Path, field: str) -> dict[str, Any]:
    """Parse a YAML file that must hold a mapping; syntax errors name the file and line."""
    from planner.io.strict import read_yaml

    data = read_yaml(path, field)
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise PlanInputError(field, f"{path}: expected a mapping of fields, the file is {kind}")
    return data


def spec_error(err: ValidationError, where: str = "", prefix: str = "") -> PlanInputError:
    """A pydantic error as `PlanInputError("where: prefix.field.path", message)`."""
    field, _, message = format_validation_error(err, prefix=prefix).partition(": ")
    return PlanInputError(f"{where}: {field}" if where else field, message)


def validate_spec(cls: type[SpecT], data: Any, where: str = "", prefix: str = "") -> SpecT:
    """`cls.model_validate(data)`; a schema error becomes `where: prefix.field.path: message`."""
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise spec_error(err, where, prefix) from None


def _load_file(cls: type[SpecT], path: Path, field: str) -> SpecT:
    """Read and validate one file; unchanged files are parsed once (specs are frozen)."""
    try:
        stat = path.stat()
    except OSError:
        return validate_spec(cls, read_yaml_mapping(path, field), str(path))
    return _load_file_cached(cls, path, stat.st_mtime_ns, stat.st_size, field)


@functools.lru_cache(maxsize=1024)
def _load_file_cached(
    cls: type[SpecT], path: Path, mtime_ns: int, size: int, field: str,
) -> SpecT:
    del mtime_ns, size  # part of the cache key only: an edited file is read again
    return validate_spec(cls, read_yaml_mapping(path, field), str(path))


def _with_parents(path: Path, extra_dirs: Sequence[Path]) -> tuple[Path, ...]:
    """Resolve references of a user file next to it too: `DIR/nodes/x.yaml` looks in `DIR/gpus/`."""
    return (*map(Path, extra_dirs), path.parent, path.parent.parent)


# --------------------------------------------------------------------------- models


def load_model(name_or_path: str, extra_dirs: Sequence[Path] = ()) -> ModelSpec:
    """A model preset by name, a YAML file of ModelSpec fields, or a Hugging Face config.json
    (or a folder holding one)."""
    presets = _named_files("models", extra_dirs)
    if name_or_path in presets:
        return _load_file(ModelSpec, presets[name_or_path], "model")
    folder = Path(name_or_path)
    if folder.is_dir() and (folder / "config.json").is_file():
        return _model_from_hf(folder / "config.json")  # a downloaded Hugging Face model folder
    if _looks_like_path(name_or_path):
        path = _existing_file(Path(name_or_path), "model")
        if path.suffix == ".json":
            return _model_from_hf(path)
    else:
        path = _find("models", name_or_path, extra_dirs)
    return _load_file(ModelSpec, path, "model")


def _model_from_hf(path: Path) -> ModelSpec:
    from planner.io.hf_config import model_from_hf_config  # imported here: only JSON paths need it

    return model_from_hf_config(path)


# --------------------------------------------------------------------------- hardware


def load_gpu(name_or_path: str, extra_dirs: Sequence[Path] = ()) -> GpuSpec:
    """A GPU profile by name (`a100-80gb`) or a YAML path of GpuSpec fields."""
    return _load_profile(GpuSpec, "gpus", "gpu", name_or_path, extra_dirs)[0]


def load_node(name_or_path: str, extra_dirs: Sequence[Path] = ()) -> NodeSpec:
    """A node profile by name (`dgx-a100`) or a YAML path of NodeSpec fields (gpu unresolved)."""
    return _load_node_with_path(name_or_path, extra_dirs)[0]


def _load_node_with_path(name_or_path: str, extra_dirs: Sequence[Path]) -> tuple[NodeSpec, Path]:
    return _load_profile(NodeSpec, "nodes", "node", name_or_path, extra_dirs)


def _load_profile(spec_cls, folder: str, field: str, name_or_path: str,
                  extra_dirs: Sequence[Path]):  # type: ignore[no-untyped-def]
    """A profile of `spec_cls` by name (searched in `folder`) or by path, with the file it came from."""
    if _looks_like_path(name_or_path):
        path = _existing_file(Path(name_or_path), field)
    else:
        path = _find(folder, name_or_path, extra_dirs)
    return _load_file(spec_cls, path, field), path


def _node_gpu(node: NodeSpec, node_path: Path, extra_dirs: Sequence[Path]) -> GpuSpec:
    """The GpuSpec a node names; an unknown name is an error naming the node file."""
    try:
        return load_gpu(node.gpu, _with_parents(node_path, extra_dirs))
    except PlanInputError as err:
        raise PlanInputError(f"{node_path}: gpu", err.message) from None


def load_cluster(name_or_path: str, extra_dirs: Sequence[Path] = ()) -> Cluster:
    """A cluster by name (`dgx2x32`), a node name meaning one node (`dgx-a100`), or a YAML path
    of ClusterSpec fields (or of NodeSpec fields, meaning one node)."""
    if _looks_like_path(name_or_path):
        path = _existing_file(Path(name_or_path), "cluster")
        data = read_yaml_mapping(path, "cluster")
        if "gpu" in data and "node" not in data:
            node = validate_spec(NodeSpec, data, str(path))
            return _one_node_cluster(node, path, extra_dirs)
        return _resolve_cluster(validate_spec(ClusterSpec, data, str(path)), path, extra_dirs)
    clusters = _named_files("clusters", extra_dirs)
    if name_or_path in clusters:
        path = clusters[name_or_path]
        return _resolve_cluster(_load_file(ClusterSpec, path, "cluster"), path, extra_dirs)
    nodes = _named_files("nodes", extra_dirs)
    if name_or_path in nodes:
        node, path = _load_node_with_path(name_or_path, extra_dirs)
        return _one_node_cluster(node, path, extra_dirs)
    raise PlanInputError(
        "cluster",
        f"unknown cluster {name_or_path!r}; clusters: {', '.join(sorted(clusters)) or '(none)'}; "
        f"nodes (one node each): {', '.join(sorted(nodes)) or '(none)'}",
    )


def _resolve_cluster(spec: ClusterSpec, path: Path, extra_dirs: Sequence[Path]) -> Cluster:
    """Turn a cluster file into a Cluster, loading its node and the node's GPU."""
    search = _with_parents(path, extra_dirs)
    try:
        node, node_path = _load_node_with_path(spec.node, search)
    except PlanInputError as err:
        raise PlanInputError(f"{path}: node", err.message) from None
    return Cluster(
        name=spec.name, gpu=_node_gpu(node, node_path, search), node=node,
        num_nodes=spec.num_nodes, inter_node_gb_per_s=spec.inter_node_gb_per_s,
        inter_node_latency_us=spec.inter_node_latency_us,
    )


def _network_of(node_names: set[str], extra_dirs: Sequence[Path]) -> ClusterSpec | None:
    """The first cluster file (by name) built from this node: where its network numbers live."""
    for path in _named_files("clusters", extra_dirs).values():
        try:
            spec = _load_file(ClusterSpec, path, "cluster")
        except PlanInputError:
            continue  # a broken user file must not hide the shipped networks
        if spec.node in node_names:
            return spec
    return None


def _one_node_cluster(
    node: NodeSpec, node_path: Path, extra_dirs: Sequence[Path], num_nodes: int = 1,
    name: str | None = None,
) -> Cluster:
    """`num_nodes` copies of a node, the network taken from a cluster file using that node.

    With one node and no such file the network is never used; the intra-node link stands in
    (Cluster requires positive numbers).
    """
    search = _with_parents(node_path, extra_dirs)
    network = _network_of({node.name, node_path.stem}, search)
    if network is None and num_nodes > 1:
        raise PlanInputError(
            "gpus", f"{num_nodes} nodes of {node.name} need a network, and no cluster file uses "
            f"node {node.name}; write one in DIR/clusters/ (see docs/hardware.md)")
    gb_per_s = network.inter_node_gb_per_s if network else node.intra_node_gb_per_s
    latency_us = network.inter_node_latency_us if network else node.intra_node_latency_us
    return Cluster(
        name=name or node.name, gpu=_node_gpu(node, node_path, search), node=node,
        num_nodes=num_nodes, inter_node_gb_per_s=gb_per_s, inter_node_latency_us=latency_us,
    )


def _nodes_with_gpu(gpu: str, extra_dirs: Sequence[Path]) -> list[tuple[NodeSpec, Path]]:
    """Loadable nodes built from a GPU, DGX-class first, then by name."""
    found = []
    for path in _named_files("nodes", extra_dirs).values():  # one listing of the folders
        try:
            node = _load_file(NodeSpec, path, "node")
        except PlanInputError:
            continue
        if node.gpu == gpu:
            found.append((node, path))
    return sorted(found, key=lambda item: (not item[0].name.startswith("dgx"), item[0].name))


def _gpus_with_nodes(extra_dirs: Sequence[Path]) -> list[str]:
    gpus = set()
    for path in _named_files("nodes", extra_dirs).values():
        try:
            gpus.add(_load_file(NodeSpec, path, "node").gpu)
        except PlanInputError:
            continue
    return sorted(gpus)


def cluster_for_gpus(gpu: str, num_gpus: int, extra_dirs: Sequence[Path] = ()) -> Cluster:
    """`--gpu a100-80gb --gpus 256`: whole nodes of the shipped node type with that GPU.

    Fewer GPUs than the first node type holds (DGX profiles first, then by name): one node with
    `gpus_per_node = num_gpus` and that share of the node's CPU RAM and NVMe
    (memory.host.partial_node). More: whole nodes of the first node type whose size divides the
    count (nodes = num_gpus / gpus_per_node), e.g. 128 GB200 as two 64-GPU NVLink segments of
    `gb200-nvl72-seg16` where 72-GPU racks do not divide it.
    """
    load_gpu(gpu, extra_dirs)  # unknown GPU names list the allowed ones
    if num_gpus <= 0:
        raise PlanInputError("gpus", f"must be a positive number of GPUs (got {num_gpus})")
    candidates = _nodes_with_gpu(gpu, extra_dirs)
    if not candidates:
        raise PlanInputError(
            "gpu", f"no node profile uses gpu {gpu!r}; GPUs with nodes: "
            f"{', '.join(_gpus_with_nodes(extra_dirs)) or '(none)'} (or give --cluster)")
    node, path = candidates[0]
    per_node = node.gpus_per_node
    if num_gpus < per_node:
        small = partial_node(node, num_gpus)  # its share of the node's RAM and NVMe
        return _one_node_cluster(small, path, extra_dirs, name=f"{node.name}-{num_gpus}gpu")
    dividing = [(n, p) for n, p in candidates if num_gpus % n.gpus_per_node == 0]
    if not dividing:
        lower = num_gpus // per_node * per_node
        others = "".join(f"; {n.gpus_per_node} GPUs per {n.name} node" for n, _ in candidates[1:])
        raise PlanInputError(
            "gpus", f"{num_gpus} GPUs is not a multiple of {per_node} GPUs per {node.name} node "
            f"(nearest: {lower} or {lower + per_node}){others}, and more than one node")
    node, path = dividing[0]  # e.g. 128 GB200: two 64-GPU NVLink segments, not 72-GPU racks
    per_node = node.gpus_per_node
    nodes = num_gpus // per_node
    name = node.name if nodes == 1 else f"{node.name}x{nodes}"
    return _one_node_cluster(node, path, extra_dirs, num_nodes=nodes, name=name)

