"""How a run's teachers split into contiguous shards (one per machine or actor).

A shard is a :class:`dclens.datalens.teacher_group.TeacherGroup`.  Its summed votes equal those of
the same teachers in the whole run bit for bit only if it starts at a multiple of
``teacher_chunk`` (the stochastic sign's uniforms are keyed by the first teacher of each
chunk), so :func:`plan_shards` cuts at chunk boundaries: shard s gets whole chunks, as
evenly as the chunks allow (sizes differ by at most one chunk; the last may be short).
"""

from __future__ import annotations

import dataclasses


class ShardPlanError(ValueError):
    """The shard count does not fit the run (the message names the fix)."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """Teachers [first, stop) of the run."""

    index: int
    first: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.first


def plan_shards(num_teachers: int, shards: int, teacher_chunk: int) -> list[Shard]:
    """``shards`` contiguous shards of whole chunks covering teachers [0, num_teachers)."""
    for name, value in (("num_teachers", num_teachers), ("shards", shards),
                        ("teacher_chunk", teacher_chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ShardPlanError(f"{name} = {value!r}: must be an integer >= 1")
    chunks = -(-num_teachers // teacher_chunk)
    if shards > num_teachers:
        raise ShardPlanError(f"--shards {shards} is more than the {num_teachers} teachers: "
                             f"every shard needs a teacher; use at most {num_teachers}")
    if shards > chunks:
        raise ShardPlanError(
            f"--shards {shards} is more than the {chunks} chunks of --teacher_chunk "
            f"{teacher_chunk} teachers: shards are cut at chunk boundaries (so their votes "
            f"equal the whole run's); use at most {chunks} shards or a --teacher_chunk of "
            f"at most {num_teachers // shards}")
    base, extra = divmod(chunks, shards)
    plan, chunk = [], 0
    for index in range(shards):
        size = base + (1 if index < extra else 0)
        first = chunk * teacher_chunk
        chunk += size
        plan.append(Shard(index, first, min(chunk * teacher_chunk, num_teachers)))
    return plan
