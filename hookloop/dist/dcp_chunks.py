"""Proof that the chunks a sharded checkpoint declares for a tensor tile it exactly.

A DCP ``.metadata`` lists, per tensor, the chunks (an offset and a size per dimension) its
ranks saved. Counting elements is not enough: rows 0-39 and rows 8-31 of a 64-row tensor hold
as many elements as rows 0-63 minus a gap, and a load would leave the gap's values as they
were. :func:`check_tiling` proves that every element is covered by exactly one chunk before
any shard is read:

1. every chunk lies inside the tensor, and their volumes add up to the tensor's;
2. the chunks' boundaries cut each dimension into intervals, which cut the tensor into a grid
   of cells; a chunk covers whole cells. Counting, per cell, the chunks that cover it (one
   slice-add per chunk on a small integer grid) shows each cell covered exactly once.

DCP saves the chunks of a device mesh, so the grid has as many cells as there are chunks; a
layout whose grid would have more than ``MAX_CELLS_PER_CHUNK`` cells per chunk (or whose
chunks would together touch more cells than the grid has, which only overlaps can cause) is
refused rather than counted, so the proof costs at most a few million integer additions.
"""
import bisect

import torch

MAX_CELLS_PER_CHUNK = 64


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def check_tiling(key, size, chunks, refuse):
    """Refuse (``refuse(why)`` raises) unless ``chunks`` -- ``[(offsets, sizes)]``, tuples of
    non-negative ints -- tile the tensor of shape ``size`` exactly: no gap, no overlap."""
    for offsets, sizes in chunks:
        if len(offsets) != len(size) or len(sizes) != len(size) or any(
                o + s > n for o, s, n in zip(offsets, sizes, size)):
            refuse(f'{key!r} has a chunk at {list(offsets)[:8]} of {list(sizes)[:8]} outside its shape {list(size)}')
    chunks = [(o, s) for o, s in chunks if _numel(s)]  # an empty chunk (a rank with no rows) covers nothing
    covered = sum(_numel(s) for _, s in chunks)
    if covered != _numel(size):
        refuse(f'{key!r}: its chunks hold {covered} elements, its shape {_numel(size)} '
               f'({"overlapping chunks" if covered > _numel(size) else "a part no chunk covers"})')
    if len(chunks) <= 1 or not size:
        return
    cuts = [sorted({0, n, *(o[d] for o, _ in chunks), *(o[d] + s[d] for o, s in chunks)})
            for d, n in enumerate(size)]
    grid = [len(c) - 1 for c in cuts]
    cells = _numel(grid)
    if cells > MAX_CELLS_PER_CHUNK * len(chunks):
        refuse(f'{key!r}: its {len(chunks)} chunks do not form a grid (they cut it into {cells} cells), '
               'which torch.distributed.checkpoint does not write')
    boxes = []
    for offsets, sizes in chunks:
        box = tuple(slice(bisect.bisect_left(c, o), bisect.bisect_left(c, o + s))
                    for c, o, s in zip(cuts, offsets, sizes))
        boxes.append(box)
    if sum(_numel([b.stop - b.start for b in box]) for box in boxes) != cells:
        refuse(f'{key!r}: its chunks overlap and leave a part no chunk covers')
    counts = torch.zeros(grid, dtype=torch.int32)
    for box in boxes:
        counts[box] += 1
    if not bool((counts == 1).all()):
        refuse(f'{key!r}: its chunks overlap and leave a part no chunk covers')
