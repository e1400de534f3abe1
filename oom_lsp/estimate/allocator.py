"""A model of PyTorch's CUDA caching allocator, for *reserved* memory.

Replays the trace's allocation log (allocation id, signed size) through the
rules documented in PyTorch's CUDA memory notes: requests of at most 1 MiB
come from 2 MiB segments (the small pool), 1-10 MiB requests from 20 MiB
segments, larger ones get their own segment rounded up to 2 MiB; a free block
is split when the remainder is worth keeping (>= 512 B small, > 1 MiB large),
freed blocks merge with free neighbours of the same segment, blocks of
different segments never merge, and nothing is returned to the driver (no
`empty_cache`, a single stream). Best fit within a pool, as the allocator's
size-ordered free sets do. Not calibrated on a GPU (docs/estimate.md).
Pure Python, no torch.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

KIB, MIB = 2**10, 2**20
MIN_BLOCK = 512
SMALL_SIZE = 1 * MIB
SMALL_SEGMENT = 2 * MIB
LARGE_SEGMENT = 20 * MIB
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = field(default=None, repr=False)
    next: _Block | None = field(default=None, repr=False)


def round_size(size: int) -> int:
    return max(MIN_BLOCK, -(-size // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocatorModel:
    def __init__(self) -> None:
        # Per pool, free blocks sorted by (size, segment, offset): best fit.
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._blocks: dict[tuple[int, int], _Block] = {}
        self._live: dict[int, _Block] = {}
        self._segments = 0
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    def _add_free(self, block: _Block, small: bool) -> None:
        bisect.insort(self._free[small], (block.size, block.segment, block.offset))

    def _remove_free(self, block: _Block, small: bool) -> None:
        entries = self._free[small]
        index = bisect.bisect_left(entries, (block.size, block.segment, block.offset))
        del entries[index]

    def malloc(self, alloc_id: int, size: int) -> None:
        if size == 0:
            return
        size = round_size(size)
        small = size <= SMALL_SIZE
        entries = self._free[small]
        index = bisect.bisect_left(entries, (size, -1, -1))
        if index < len(entries):
            _, segment, offset = entries.pop(index)
            block = self._blocks[(segment, offset)]
        else:
            seg_size = segment_size(size)
            block = _Block(self._segments, 0, seg_size, small)
            self._segments += 1
            self._blocks[(block.segment, 0)] = block
            self.reserved += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = _Block(block.segment, block.offset + size, remaining, small, True, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._blocks[(rest.segment, rest.offset)] = rest
            self._add_free(rest, small)
        block.free = False
        self._live[alloc_id] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, alloc_id: int) -> None:
        block = self._live.pop(alloc_id, None)
        if block is None:
            return
        small = block.small
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._remove_free(neighbour, small)
                first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
                del self._blocks[(second.segment, second.offset)]
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                block = first
        self._add_free(block, small)


def simulate(events: list[list[int]]) -> CachingAllocatorModel:
    """Replay [[alloc_id, signed_size], ...] (positive: malloc, negative: free)."""
    model = CachingAllocatorModel()
    for alloc_id, size in events:
        if size > 0:
            model.malloc(alloc_id, size)
        elif size < 0:
            model.free(alloc_id)
    return model
