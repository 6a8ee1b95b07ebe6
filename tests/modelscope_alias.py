"""A rename-only alias: the ``modelscope`` modules ModelScope's examples and tests import, each
pointing at ``hookloop.compat.modelscope_api`` (nothing else is defined here, besides
ModelScope's own test helper ``test_level`` and a stand-in for OpenCV's ``imwrite``, which the
examples use to save the generated image and which is not installed)."""
import os
import sys
import types

MODULES = ('modelscope', 'modelscope.metainfo', 'modelscope.msdatasets', 'modelscope.pipelines',
           'modelscope.trainers', 'modelscope.trainers.training_args', 'modelscope.utils',
           'modelscope.utils.constant', 'modelscope.outputs')


def install(monkeypatch):
    """Point the ``modelscope`` modules (and ``cv2``) at hookloop for the current test."""
    from hookloop.compat import modelscope_api
    for name in MODULES:
        monkeypatch.setitem(sys.modules, name, modelscope_api)
    test_utils = types.ModuleType('modelscope.utils.test_utils')
    test_utils.test_level = lambda: int(os.environ.get('TEST_LEVEL', 0))
    monkeypatch.setitem(sys.modules, 'modelscope.utils.test_utils', test_utils)
    cv2 = types.ModuleType('cv2')
    cv2.imwrite = _imwrite
    monkeypatch.setitem(sys.modules, 'cv2', cv2)


def _imwrite(path, image):
    """OpenCV's imwrite of a BGR uint8 array, through PIL."""
    from PIL import Image
    Image.fromarray(image[:, :, ::-1].copy()).save(path)
    return True
