"""The step benchmark (dclens.experiments.bench) runs the mechanism it names, and only that one."""

from __future__ import annotations

import pytest

from dclens.experiments import bench
from dclens.datalens.config import Aggregation, preset


def test_bench_config_keeps_the_preset_unless_an_aggregation_is_named():
    spec = bench.SPECS["fmnist-200"]
    paper = preset(spec.preset)
    plain = bench.bench_config(spec, measured_teachers=4, chunk=2)
    assert plain.topagg == paper.topagg and plain.budget == paper.budget
    assert (plain.train.num_teachers, plain.train.teacher_chunk) == (4, 2)
    named = bench.bench_config(spec, measured_teachers=4, chunk=None,
                               aggregation=Aggregation.FETCHSGD)
    assert named.topagg.method is Aggregation.FETCHSGD
    assert named.topagg.sigma == paper.topagg.sigma
    assert named.budget.max_eps == bench.LIFTED_BUDGET_EPS


@pytest.mark.parametrize("aggregation", [Aggregation.KLEVEL, Aggregation.FETCHSGD])
def test_run_bench_times_the_named_aggregation(aggregation):
    """Two teachers, one timed step: the output names the mechanism and the lifted budget,
    times a vote and a release, and extrapolates to the configuration's 200 teachers.
    FetchSGD's proven sensitivity spends the preset's epsilon = 1 before a second step, so
    without the lifted budget this run would stop with no timed step."""
    result = bench.run_bench(bench.SPECS["fmnist-200"], steps=1, warmup=1,
                             options=bench.BenchOptions(measured_teachers=2, chunk=2,
                                                        aggregation=aggregation))
    assert result["aggregation"] == aggregation.value
    assert result["budget_eps"] == bench.LIFTED_BUDGET_EPS
    measured = result["measured"]
    assert measured["timed_steps"] == 1 and not measured["stopped_by_budget"]
    assert measured["phases_median_seconds"]["voting"] > 0
    assert measured["phases_median_seconds"]["noise"] > 0
    assert result["extrapolated"]["num_teachers"] == 200
