"""torch.distributed: the process group (torchrun), DDP/FSDP2 wrapping and sharded checkpoints.
May import: ``checkpoint``, ``fileio``, ``errors``.
"""
