"""A rename-only alias: the ``modelscope`` modules ModelScope's examples and tests import, each
pointing at ``hookloop.compat.modelscope_api`` (nothing else is defined here, besides
ModelScope's own test helpers ``test_level`` and ``create_dummy_test_dataset``, and a stand-in
for OpenCV's ``imwrite``, which the examples use to save the generated image and which is not
installed)."""
import os
import sys
import types

MODULES = ('modelscope', 'modelscope.metainfo', 'modelscope.msdatasets', 'modelscope.pipelines',
           'modelscope.trainers', 'modelscope.trainers.training_args', 'modelscope.trainers.trainer',
           'modelscope.trainers.builder', 'modelscope.trainers.base', 'modelscope.trainers.default_config',
           'modelscope.metrics', 'modelscope.metrics.builder', 'modelscope.models', 'modelscope.models.base',
           'modelscope.utils', 'modelscope.utils.constant', 'modelscope.utils.registry', 'modelscope.outputs')


def modules():
    """``{module name: module}`` of the alias (and ``cv2``)."""
    from hookloop.compat import modelscope_api
    aliased = {name: modelscope_api for name in MODULES}
    test_utils = types.ModuleType('modelscope.utils.test_utils')
    test_utils.test_level = lambda: int(os.environ.get('TEST_LEVEL', 0))
    test_utils.create_dummy_test_dataset = create_dummy_test_dataset
    aliased['modelscope.utils.test_utils'] = test_utils
    cv2 = types.ModuleType('cv2')
    cv2.imwrite = _imwrite
    aliased['cv2'] = cv2
    return aliased


def install(monkeypatch):
    """Point the ``modelscope`` modules (and ``cv2``) at hookloop for the current test."""
    for name, module in modules().items():
        monkeypatch.setitem(sys.modules, name, module)


def create_dummy_test_dataset(feat, label, num):
    """ModelScope's test helper: ``num`` rows ``{'feat': feat, 'labels': label}`` (float32 and
    int64 tensors, as its dataset hands them to the trainer)."""
    import torch
    from torch.utils.data import Dataset

    class DummyDataset(Dataset):
        def __len__(self):
            return num

        def __getitem__(self, index):
            return {'feat': torch.tensor(feat, dtype=torch.float32), 'labels': torch.tensor(label, dtype=torch.long)}
    return DummyDataset()


def _imwrite(path, image):
    """OpenCV's imwrite of a BGR uint8 array, through PIL."""
    from PIL import Image
    Image.fromarray(image[:, :, ::-1].copy()).save(path)
    return True
