"""torch.distributed: the process group (torchrun), DDP/FSDP2 wrapping, and writing and loading
sharded checkpoints through DCP, their ``.metadata`` read safely (the files themselves are
``checkpoint.sharded_files``').
May import: ``checkpoint``, ``fileio``, ``config``, ``registry``, ``priority``, ``errors``.
"""
