"""``mmcv.runner.fp16_utils``: the fp16 decorators and helpers (``hookloop/optim/amp.py``)."""
from . import wrap_fp16_model  # noqa: F401
from ...optim.amp import auto_fp16, cast_tensor_type, force_fp32  # noqa: F401
