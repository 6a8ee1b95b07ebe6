"""Adapters for code and configs written for other engines: ``compat.mmcv`` (the ``mmcv.runner``
names), ``compat.mmcv_config`` (MMCV 1.x config keys), ``compat.modelscope`` (ModelScope configs),
``compat.build`` (``build_trainer``: translate, then build). May import: ``engine`` and everything below it; not ``dreambooth``, ``commands`` or ``cli``."""
