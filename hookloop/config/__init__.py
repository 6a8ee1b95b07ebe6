"""Config files: loading MMCV-style ``.py`` / JSON / YAML configs, ``_base_`` merging and
``{{_base_.x}}`` references.
May import: ``errors``, ``registry``, ``priority``.
"""
from .loader import Config, load_config  # noqa: F401  (the public names)
