"""Logging: the run logger and its fast line, device meters, images and hook profiling.
May import: ``dist``, ``fileio``, ``errors``.
"""
