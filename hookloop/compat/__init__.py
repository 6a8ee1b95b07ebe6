"""Adapters for code and configs written for other engines: ``compat.mmcv`` (the
``mmcv.runner`` names), ``compat.mmcv_config`` (MMCV 1.x config keys) and
``compat.modelscope`` (ModelScope ``configuration.json`` files and ``build_trainer``)."""
