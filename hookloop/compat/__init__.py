"""Adapters for code and configs written for other engines: ``compat.mmcv`` (the ``mmcv.runner``
names), ``compat.mmcv_config`` (MMCV 1.x config keys), ``compat.modelscope`` (ModelScope configs).
May import: ``engine`` and everything below it; not ``dreambooth``, ``commands`` or ``cli``."""
