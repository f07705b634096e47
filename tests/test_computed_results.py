"""Results built with `Frozen.computed` (pydantic's `model_construct`, no validation) hold exactly
what validation would have given them.

`zplan fit` builds its results (parameter counts, memory plan, step estimate, the fit result)
without validating them, so that their validators are never built on the command line's path
(issue 9, command latency). These tests re-validate every result that fit, check and sweep
build, over random layouts of several models, and compare value by value *and type by type*:
a numpy integer where the field says `int`, an `int` where it says `float`, or a list where it
says tuple would pass unnoticed by `==` but print and serialise differently.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from planner.core.errors import PlanInputError
from planner.core.spec import Cluster, Layout, ModelSpec, TrainSetup
from planner.io import loading
from planner.io.check import check
from planner.io.jobfile import make_setup
from planner.search import fitting
from planner.search.sweep import sweep
from planner.timing.steptime import Rates

ROOT = Path(__file__).resolve().parents[1]
INPUTS = (ModelSpec, Cluster, Layout, TrainSetup)
"""The user's inputs inside a result: validated when read, not built by `computed`."""
MODELS = ("gpt3-125m", "bert-large", "llama3-8b", "mixtral-8x7b", "deepseek-v3")


def assert_same(built: object, validated: object, where: str = "result") -> None:
    """Equal values of identical types, recursively through models, sequences and mappings."""
    assert type(built) is type(validated), f"{where}: {type(built).__name__} != {type(validated).__name__}"
    if isinstance(built, INPUTS):  # validated when read; pydantic leaves defaults as written
        assert built == validated, where  # (`fp8_weight_cache_bytes: float = 0` stays int 0)
    elif isinstance(built, BaseModel):
        for name in type(built).model_fields:
            assert_same(getattr(built, name), getattr(validated, name), f"{where}.{name}")
    elif isinstance(built, (list, tuple)):
        assert len(built) == len(validated), where
        for i, (a, b) in enumerate(zip(built, validated)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(built, dict):
        assert built.keys() == validated.keys(), where
        for key in built:
            assert_same(built[key], validated[key], f"{where}[{key!r}]")
    elif isinstance(built, float) and math.isnan(built):
        assert math.isnan(validated), where
    else:
        assert built == validated, f"{where}: {built!r} != {validated!r}"


def revalidated(result: BaseModel) -> BaseModel:
    """The result as validation builds it from its own fields."""
    return type(result).model_validate(result.model_dump())


@st.composite
def layouts(draw):
    """(model, cluster, layout, setup) the planner accepts; a few fields of every kind."""
    name = draw(st.sampled_from(MODELS))
    model = loading.load_model(name)
    tp, pp, dp = (draw(st.sampled_from(v)) for v in ((1, 2, 8), (1, 2, 4), (1, 2, 8)))
    ep = draw(st.sampled_from((1, 2))) if model.num_experts else 1
    stage = draw(st.sampled_from((0, 1, 2, 3)))
    fields = dict(
        tp=tp, pp=pp, dp=dp, ep=ep, zero_stage=stage,
        offload_optimizer=draw(st.sampled_from(("none", "cpu"))) if stage else "none",
        recompute=draw(st.sampled_from(("none", "selective", "full"))),
        sequence_parallel=tp > 1 and draw(st.booleans()),
        micro_batch=draw(st.sampled_from((1, 2))), grad_accum=draw(st.sampled_from((1, 4))),
        dp_engine=draw(st.sampled_from(("deepspeed", "fsdp2"))) if stage >= 2 else "deepspeed",
    )
    try:
        layout = Layout(**fields)
        setup = make_setup(256, layout.micro_batch * layout.grad_accum * dp, 1e12)
        cluster = loading.cluster_for_gpus("h100-sxm", tp * pp * dp)
        fitting.fit_layout(model, cluster, layout, setup, None)
    except (PlanInputError, ValueError):
        assume(False)
    return model, cluster, layout, setup


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(layouts())
def test_fit_of_a_layout_builds_what_validation_would(job):
    result = fitting.fit_layout(*job, None)
    assert_same(result, revalidated(result))


@pytest.mark.parametrize("name, gpu, gpus", [("gpt3-1.3b", "h100-sxm", 8), ("mixtral-8x7b", "h100-sxm", 64),
                                             ("gpt3-175b", "rtx-4090", 1)])
def test_fit_search_builds_what_validation_would(name, gpu, gpus):
    """Without a layout: the best layout and the strategy minimums; gpt3-175b on one 24 GB card
    has no layout at all (its bf16 weights alone are 350 GB)."""
    cluster = loading.cluster_for_gpus(gpu, gpus)
    result = fitting.fit_search(loading.load_model(name), cluster, make_setup(2048, gpus, 1e12), None)
    assert result.strategies and result.fits is (name != "gpt3-175b")
    assert_same(result, revalidated(result))


def test_suggestions_for_a_layout_that_does_not_fit():
    """GPT-3 175B on 512 V100 32 GB (dgx2x32) at tp 8, pp 8, ZeRO-1 without recompute: does not
    fit, and `--recompute full` does (the `Suggestion` results)."""
    layout = Layout(tp=8, pp=8, dp=8, zero_stage=1, grad_accum=192)
    result = fitting.fit_layout(loading.load_model("gpt3-175b"), loading.load_cluster("dgx2x32"),
                                layout, make_setup(2048, 1536, 300e9), None)
    assert not result.fits and result.suggestions
    assert_same(result, revalidated(result))


def test_check_sweep_and_show_build_what_validation_would():
    model, cluster = loading.load_model("llama3-8b"), loading.load_cluster("dgx-h100x32")
    layout = Layout(tp=2, pp=2, dp=64, zero_stage=1, recompute="selective", grad_accum=2)
    setup = make_setup(4096, 128, 1e12)  # 1 sequence x 2 micro-batches x dp 64
    checked = check(model, cluster, layout, setup)
    assert_same(checked, revalidated(checked))
    swept = sweep(model, cluster, setup)
    assert swept.top and swept.rejected
    assert_same(swept, revalidated(swept))
    summary = fitting.model_summary(model, 4096)
    assert_same(summary, revalidated(summary))


def test_computed_refuses_a_name_the_class_does_not_have():
    """`model_construct` drops unknown names silently; `computed` names them."""
    with pytest.raises(TypeError, match="Rates has no field no_such_rate"):
        Rates.computed(no_such_rate=1.0)


def test_fit_with_a_layout_builds_no_result_validator():
    """The point of `computed`: in a fresh interpreter, `fit_layout` and the human report leave
    the result classes' validators unbuilt (each costs ~0.3-0.6 ms to build)."""
    code = (
        "import io, contextlib\n"
        "from planner.io import loading\n"
        "from planner.io.jobfile import make_setup\n"
        "from planner.core.spec import Layout, Frozen\n"
        "from planner.search import fitting\n"
        "from planner.cli.report import fit as render\n"
        "m = loading.load_model('gpt3-175b'); c = loading.load_cluster('dgx2x32')\n"
        "lay = Layout(tp=8, pp=8, dp=8, zero_stage=1, recompute='full', grad_accum=192)\n"
        "r = fitting.fit_layout(m, c, lay, make_setup(2048, 1536, 300e9), None)\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    render.print_fit(r)\n"
        "def walk(cls):\n"
        "    for sub in cls.__subclasses__():\n"
        "        yield sub\n"
        "        yield from walk(sub)\n"
        "print(sorted({k.__name__ for k in walk(Frozen) if k.__pydantic_complete__}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    built = set(eval(out))  # noqa: S307 - our own printed list of class names
    for result_class in ("FitResult", "MemoryPlan", "StageMemory", "NodeMemory", "StepEstimate",
                         "Rates", "ParamCount", "LayerParams", "StageParams", "StageActivations",
                         "ModelStateBytes", "FlopsBreakdown"):
        assert result_class not in built
    assert {"ModelSpec", "Layout", "TrainSetup"} <= built  # inputs are still validated
