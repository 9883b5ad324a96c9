"""How a snapshot is cut into the parts of its multipart upload, whatever its size, in bounded memory.

S3 takes at most 10,000 parts in one upload, each from 5 MiB (all but the last) to
5 GiB. Parts of a fixed 16 MiB would stop a snapshot at 160 GiB, after hours of frozen
work. So the part size follows the data:

- **Planned from the source's size**, read once the source is frozen: the first parts
  are large enough for that size to fill at most half of the parts, and never smaller
  than the worker's --snapshot-part-size-mib.
- **Grown when the dump outgrows the plan.** A dump can be larger than the database it
  comes from (values compressed in the database's TOAST storage are dumped whole, bytea
  as text). Parts may differ in size, so whenever half of the parts still free have been
  used, the part size doubles, up to S3's 5 GiB: the parts run out only past any size S3
  takes for one object.
- **Memory bounded.** What a snapshot holds is the part being read plus the parts in
  flight: at most --snapshot-upload-concurrency of them, and no more than
  --snapshot-memory-mib holds, never fewer than one. So memory stays under the larger of
  that budget and two parts, and parts reach hundreds of MiB only for sources of tens of
  TiB.

Pure: the upload (activities/s3.py) asks this plan for each part's size and how many
may be in flight.
"""

from __future__ import annotations

import dataclasses

MIB = 1024 * 1024
MAX_PARTS = 10_000
"""S3's limit on the parts of one multipart upload."""
MIN_PART = 5 * MIB
"""S3's smallest part (but the last)."""
MAX_PART = 5 * 1024 * MIB
"""S3's largest part."""


@dataclasses.dataclass(frozen=True)
class PartPlan:
    """The sizes of an upload's parts and how many may be in flight."""

    first_part: int
    """Size of the first parts, in bytes (a whole number of MiB)."""
    concurrency: int
    """Parts in flight at most, when memory allows."""
    memory: int
    """Bytes the parts may hold at once (the part being read and those in flight)."""
    max_parts: int = MAX_PARTS

    def part_size(self, number: int) -> int:
        """Size of part `number` (from 1): doubled each time half of the parts still free are used."""
        remaining = self.max_parts - (number - 1)
        doublings = 0
        while remaining * 2 ** (doublings + 1) <= self.max_parts and self.first_part << doublings < MAX_PART:
            doublings += 1
        return min(self.first_part << doublings, MAX_PART)

    def in_flight(self, part_size: int) -> int:
        """How many parts of `part_size` may be uploading while the next one is read: with it, within memory."""
        return max(1, min(self.concurrency, self.memory // part_size - 1))

    def capacity(self) -> int:
        """The most bytes this plan's parts hold."""
        return sum(self.part_size(number) for number in range(1, self.max_parts + 1))


def plan(estimate: int, *, smallest: int, concurrency: int, memory: int, max_parts: int = MAX_PARTS) -> PartPlan:
    """The parts for a snapshot of a source of `estimate` bytes (its pg_database_size)."""
    wanted = -(-max(estimate, 0) // (max_parts // 2))  # the estimate in half of the parts
    first = max(smallest, MIN_PART, -(-wanted // MIB) * MIB)
    return PartPlan(first_part=min(first, MAX_PART), concurrency=concurrency, memory=memory, max_parts=max_parts)
