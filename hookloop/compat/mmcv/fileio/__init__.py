"""``mmcv.fileio``: ``FileClient`` (:mod:`.file_client`)."""
from .file_client import FileClient, PetrelBackend

__all__ = ['FileClient', 'PetrelBackend']
