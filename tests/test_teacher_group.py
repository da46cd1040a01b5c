"""Teacher groups (dclens/datalens/teacher_group.py): a run split into contiguous groups at
multiples of teacher_chunk gives, summed, bit for bit the whole run's votes and the same
trained teachers -- what a sharded run (one group per machine) relies on.  Also: a bank
for a sub-range is initialised exactly as those rows of the whole bank."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from conftest import synthetic_fashion_mnist
from dclens.datalens import teacher_bank
from dclens.datalens import networks, teachers
from dclens.datalens.config import (Aggregation, BudgetConfig, DataLensConfig, TopAggConfig,
                           TrainConfig)
from dclens.common.profiling import PhaseTimer
from dclens.common.rng import Stream
from dclens.datalens.teacher_group import (BankPlacement, ClassGridFakes, GroupMembers,
                                           TeacherGroup, VoteParts)
from dclens.datalens.train import DataLens, TeacherPlacement

TEACHERS, CHUNK = 8, 2


def _lens(stochastic: bool) -> DataLens:
    config = DataLensConfig(
        train=TrainConfig(num_teachers=TEACHERS, batch_size=6, d_step=1, pretrain_teacher=2,
                          z_dim=8, teacher_chunk=CHUNK),
        topagg=TopAggConfig(topk=40, sigma=5.0, thresh=0.2, max_grad=10.0, method=(
            Aggregation.TOPK_STOCHASTIC_SIGN if stochastic else Aggregation.TOPK_SIGN)),
        budget=BudgetConfig(max_eps=1e6))
    return DataLens(config, synthetic_fashion_mnist(80), root_seed=11,
                    placement=TeacherPlacement(ensemble="reference"))


def _groups(lens: DataLens, bounds: list[int]) -> list[TeacherGroup]:
    layout = teachers.ParamLayout.for_shape(lens.shape)
    parts = VoteParts(ensemble=lens.ensemble, topagg=lens.topagg, draws=lens.draws,
                      one_hot=lens.one_hot, layout=layout)
    bank = BankPlacement(lens.seeds.integer(Stream.TEACHER_INIT), overlap_io=False)
    return [TeacherGroup(lens.config, GroupMembers(lens.images, lens.labels,
                                                   lens.partitions[a:b], first=a,
                                                   total=TEACHERS),
                         parts, bank, PhaseTimer())
            for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("stochastic", [True, False])
def test_groups_split_at_chunk_boundaries_sum_to_the_whole_run(stochastic):
    lens = _lens(stochastic)
    groups = _groups(lens, [0, 2, 6, TEACHERS])          # 2, 4 and 2 teachers
    whole_rows = np.concatenate([g.bank.weights for g in groups])
    np.testing.assert_array_equal(whole_rows, lens.bank.weights)
    z = lens.latent(0)
    fakes = lens.teacher_fakes(z)
    images, one_hot = lens.query(z, 0)

    chunk_fakes = ClassGridFakes(fakes)

    loss, fused = lens.train_teachers(fakes, (images, one_hot))
    parts = [g.train(step=0, num_steps=2, columns=lens._slot_columns(),
                     chunk_fakes=chunk_fakes, query=(images, one_hot)) for g in groups]
    np.testing.assert_array_equal(sum(p[1] for p in parts), fused)
    assert np.mean(np.concatenate([p[0] for p in parts])) == pytest.approx(loss, rel=1e-6)
    np.testing.assert_array_equal(np.concatenate([g.bank.weights for g in groups]),
                                  lens.bank.weights)
    np.testing.assert_array_equal(np.concatenate([g.bank.adam_v for g in groups]),
                                  lens.bank.adam_v)
    images, one_hot = lens.query(z, 1)
    whole = lens.vote(images, one_hot, 1)
    shards = sum(g.vote(images, one_hot, step=0, round_index=1) for g in groups)
    assert whole.dtype == tf.int32
    np.testing.assert_array_equal(shards, whole)
    # The stochastic sign's uniforms (max_grad large, so the votes are random) are keyed
    # by the global first teacher of a chunk: a group that starts inside a chunk draws
    # other uniforms (so splits must be at chunk boundaries); the deterministic sign
    # agrees on any split.
    odd = _groups(lens, [0, 3, TEACHERS])
    for group, rows in zip(odd, (slice(0, 3), slice(3, TEACHERS))):
        group.bank.assign("weights", lens.bank.weights[rows])
    misaligned = sum(g.vote(images, one_hot, step=0, round_index=1) for g in odd)
    assert np.array_equal(misaligned, whole) == (not stochastic)


def test_a_sub_range_bank_is_initialised_as_those_rows_of_the_whole_bank():
    layout = teachers.ParamLayout.for_shape(networks.ImageShape(28, 28, 1, 10))
    whole = teacher_bank.TeacherBank.create(layout, 10, seed=4, init_chunk=3)
    for first, stop in ((0, 4), (4, 10), (2, 7), (9, 10)):
        part = teacher_bank.TeacherBank.create(layout, stop - first, seed=4, init_chunk=3,
                                           first_teacher=first, total_teachers=10)
        np.testing.assert_array_equal(part.weights, whole.weights[first:stop])
    with pytest.raises(ValueError, match=r"teachers \[8, 12\) are not within a run of 10"):
        teacher_bank.TeacherBank.create(layout, 4, seed=4, first_teacher=8, total_teachers=10)


@pytest.mark.parametrize("teachers_, shards, chunk", [(8, 2, 2), (8, 3, 2), (4000, 7, 250),
                                                      (10, 4, 3), (5, 5, 1)])
def test_shard_plans_cover_the_run_at_chunk_boundaries(teachers_, shards, chunk):
    from dclens.datalens.shards import plan_shards

    plan = plan_shards(teachers_, shards, chunk)
    assert [s.index for s in plan] == list(range(shards))
    assert plan[0].first == 0 and plan[-1].stop == teachers_
    assert all(a.stop == b.first for a, b in zip(plan, plan[1:]))       # contiguous
    assert all(s.first % chunk == 0 and s.count >= 1 for s in plan)     # aligned, non-empty
    sizes = [-(-s.count // chunk) for s in plan]                         # chunks per shard
    assert max(sizes) - min(sizes) <= 1


def test_shard_plans_refuse_by_name():
    from dclens.datalens.shards import ShardPlanError, plan_shards

    with pytest.raises(ShardPlanError, match="--shards 9 is more than the 8 teachers"):
        plan_shards(8, 9, 1)
    with pytest.raises(ShardPlanError, match="more than the 4 chunks of --teacher_chunk 2"):
        plan_shards(8, 5, 2)
    with pytest.raises(ShardPlanError, match="shards = 0"):
        plan_shards(8, 0, 2)
