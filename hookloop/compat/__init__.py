"""Adapters for code and configs written for other engines: ``compat.mmcv`` (``mmcv.runner``), ``compat.mmcv_config``
(MMCV 1.x keys), ``compat.modelscope`` (ModelScope configs), ``compat.build`` (``build_trainer``: translate, build).
May import: ``engine`` and everything below it; not ``dreambooth``, ``commands`` or ``cli``."""
