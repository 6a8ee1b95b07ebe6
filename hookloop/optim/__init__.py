"""Optimisation math without a trainer: mixed precision, the param-group constructor,
schedules, accumulation windows and the optimizer step processor.
May import: ``dist``, ``registry``, ``errors``.
"""
