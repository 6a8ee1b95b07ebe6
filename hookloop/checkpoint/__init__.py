"""Checkpoints on disk: the format and its atomic write, the async writer, integrity
(checksums), sharded (DCP) metadata read safely, resume search, config changes on resume,
trained-only state and best tracking. May import: ``fileio``, ``errors``.
"""
