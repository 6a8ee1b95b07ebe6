"""Optimisation without a trainer: mixed precision, the param-group constructor, schedules,
accumulation windows and the optimizer step's options (the step itself is ``hooks.optimizer``'s).
May import: ``data``, ``dist``, ``checkpoint``, ``fileio``, ``config``, ``registry``, ``priority``, ``errors``.
"""
