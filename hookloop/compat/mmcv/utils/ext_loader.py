"""``mmcv.utils.ext_loader``: hookloop has no compiled MMCV ops (``mmcv.ops``)."""


def check_ops_exist():
    """False: the CUDA/C++ ops of ``mmcv-full`` (deformable convs, RoIAlign...) are not part of hookloop."""
    return False


__all__ = ['check_ops_exist']
