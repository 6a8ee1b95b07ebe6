"""One verdict for a save that every rank makes together.

A sharded (FSDP) checkpoint is written by every rank, each its own shards, in one collective
save: if one rank's state is not finite, every rank must refuse, or the others would wait
in that save for the one that stopped. :func:`every_rank_agrees` is that agreement (one
all-reduce). Saves that rank 0 makes alone (a replicated model's checkpoint, an export,
MMCV's ``@master_only`` saves) are judged by the writing process alone and have no collective:
see docs/distributed.md.
"""
from .process_group import all_reduce_numbers


def every_rank_agrees(yes):
    """True when ``yes`` is true on every rank (``yes`` itself outside a process group).
    A collective: every rank must call it, at the same point."""
    return all_reduce_numbers([0.0 if yes else 1.0])[0] == 0


__all__ = ['every_rank_agrees']
