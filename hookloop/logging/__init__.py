"""Logging: the run logger and its fast line, device meters, images and hook profiling.
May import: ``optim``, ``data``, ``dist``, ``checkpoint``, ``fileio``, ``config``, ``registry``, ``priority``,
``errors`` (not ``hooks``: loggers are hooks, and reach logging through its API).
"""
