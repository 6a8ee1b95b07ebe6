"""Rows of an image-and-caption dataset, prepared as ModelScope's
``diffusion-image-generation-preprocessor`` prepares them for its Stable Diffusion trainers.

A row is a mapping (a ``MsDataset`` / Hugging Face ``datasets`` row, a dict): a key ending in
``:FILE`` (ModelScope's file columns, e.g. ``Target:FILE``), a key listed in ``image_keys``, or
a value that is a PIL image is an image — opened (a path is relative to ``root``), EXIF
orientation applied, converted to RGB, resized (shorter side to ``resolution``, bilinear),
cropped at the centre (``center_crop``) or at random (the global RNG, as torchvision's
``RandomCrop``), then ``(x / 255 - mean) / std``; it is stored under the key lower-cased,
without ``:FILE`` (``target``). Other values are kept under their lower-cased key (an empty one
becomes ``''``), so ``Text`` becomes ``text``: the ``forward(text=..., target=...)`` of
ModelScope's ``stable-diffusion`` model.
"""
import os
from collections.abc import Mapping

from torch.utils.data import Dataset, IterableDataset

from ..errors import ConfigError
from ..registry import DATASETS
from .dataset import image_to_tensor


@DATASETS.register_module()
class ImageCaptionRows(Dataset):
    """Rows with an image and a caption, as tensors and strings (see the module docstring).

    Args:
        rows: a map-style dataset (``len`` and ``rows[i]``) or a list of mappings.
        resolution, center_crop, mean, std, image_keys: ModelScope's preprocessor options
            (defaults as ModelScope's: 512, True, [0.5], [0.5], none).
        root: the directory relative image paths are read from (default: the current one).
    """

    def __init__(self, rows, resolution=512, center_crop=True, mean=(0.5,), std=(0.5,), image_keys=(), root=None):
        if isinstance(rows, IterableDataset) or not (hasattr(rows, '__len__') and hasattr(rows, '__getitem__')):
            raise ConfigError(f'image-caption rows must be a map-style dataset or a list of dicts (len() and '
                              f'[i]), got {type(rows).__name__}')
        if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 1:
            raise ConfigError(f'preprocessor resolution must be a positive int, got {resolution!r}')
        self.rows, self.resolution, self.center_crop = rows, resolution, bool(center_crop)
        self.normalize = (tuple(mean), tuple(std))
        self.image_keys = set(image_keys or ())
        self.root = None if root is None else os.fspath(root)

    def __len__(self):
        return len(self.rows)

    def is_image(self, key, value):
        from PIL import Image
        return key.endswith(':FILE') or key in self.image_keys or isinstance(value, Image.Image)

    def __getitem__(self, index):
        row = self.rows[index]
        if not isinstance(row, Mapping):
            raise ConfigError(f'image-caption row {index} is a {type(row).__name__}, not a mapping of columns')
        item = {}
        for key, value in row.items():
            if self.is_image(key, value):
                item[key.replace(':FILE', '').lower()] = self._image(value)
            else:
                item[key.lower()] = value if value else ''
        return item

    def _image(self, value):
        from PIL import Image
        if isinstance(value, Image.Image):
            return self._tensor(value)
        path = os.fspath(value)
        if self.root is not None and not os.path.isabs(path):
            path = os.path.join(self.root, path)
        with Image.open(path) as image:
            return self._tensor(image)

    def _tensor(self, image):
        return image_to_tensor(image, self.resolution, 3, center_crop=self.center_crop, interpolation='bilinear',
                               normalize=self.normalize)
