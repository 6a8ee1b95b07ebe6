"""Checkpoints on disk: the format, its atomic write and checksum sidecars, RNG state, the async
writer, integrity, the files of a sharded (DCP) checkpoint found and hashed, resume search, restore
checks, config changes on resume, trained-only state, best tracking.
May import: ``fileio``, ``config``, ``registry``, ``priority``, ``errors`` (never ``dist``).
"""
