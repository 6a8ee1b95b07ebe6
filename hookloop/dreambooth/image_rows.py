"""Rows of an image-and-caption dataset (by index: :class:`ImageCaptionRows`; in order:
:class:`ImageCaptionStream`), prepared as ModelScope's
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


def is_row_stream(rows):
    """Whether ``rows`` are read in order (an ``IterableDataset``, a Hugging Face iterable
    dataset, any iterable without ``len`` and ``[i]``) rather than by index."""
    return isinstance(rows, IterableDataset) or not (hasattr(rows, '__len__') and hasattr(rows, '__getitem__'))


@DATASETS.register_module()
class ImageCaptionRows(Dataset):
    """Rows with an image and a caption, as tensors and strings (see the module docstring).

    Args:
        rows: a map-style dataset (``len`` and ``rows[i]``) or a list of mappings
            (:class:`ImageCaptionStream` for rows read in order).
        resolution, center_crop, mean, std, image_keys: ModelScope's preprocessor options
            (defaults as ModelScope's: 512, True, [0.5], [0.5], none).
        root: the directory relative image paths are read from (default: the current one).
    """

    def __init__(self, rows, resolution=512, center_crop=True, mean=(0.5,), std=(0.5,), image_keys=(), root=None):
        if is_row_stream(rows):
            raise ConfigError(f'image-caption rows by index need a map-style dataset or a list of dicts (len() and '
                              f'[i]), got {type(rows).__name__}; ImageCaptionStream reads rows in order')
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
        return self.prepare(self.rows[index], index)

    def first_row(self):
        return self.rows[0] if len(self.rows) else None

    def check_columns(self, what):
        """ConfigError (``what`` names the dataset) unless the first row gives ``target`` and
        ``text`` once prepared (``Target:FILE`` and ``Text``, as ModelScope's hub datasets)."""
        row = self.first_row()
        if row is None:
            raise ConfigError(f'{what} is empty')
        keys = {str(k).replace(':FILE', '').lower() for k in row} if isinstance(row, Mapping) else set()
        keys |= {str(k).lower() for k in self.image_keys}
        if not {'target', 'text'} <= keys:
            raise ConfigError(f'{what} rows must give an image as "Target:FILE" (or "target" in the preprocessor\'s '
                              'image_keys) and a caption as "Text"; the first row has '
                              f'{sorted(row) if isinstance(row, Mapping) else type(row).__name__}')

    def prepare(self, row, index):
        """One row as ModelScope's preprocessor makes it (see the module docstring)."""
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


@DATASETS.register_module()
class ImageCaptionStream(IterableDataset):
    """:class:`ImageCaptionRows` for rows read in order (an ``IterableDataset``, a streaming
    Hugging Face dataset, a generator function's iterable): each row prepared as it comes. The
    arguments are :class:`ImageCaptionRows`'s; an epoch needs ``train_iters_per_epoch``."""

    def __init__(self, rows, **options):
        self.rows = rows
        self.preparation = ImageCaptionRows([], **options)  # its options, checked once

    def __iter__(self):
        for index, row in enumerate(self.rows):
            yield self.preparation.prepare(row, index)

    def first_row(self):
        return next(iter(self.rows), None)  # a fresh iterator: the stream is read again from its start

    def check_columns(self, what):
        ImageCaptionRows.check_columns(self, what)

    @property
    def image_keys(self):
        return self.preparation.image_keys


@DATASETS.register_module(module_name='ImageCaptionData')
def image_caption_data(rows, **options):
    """:class:`ImageCaptionRows` or :class:`ImageCaptionStream`, as ``rows`` are read (a dict of
    splits is refused: pick one)."""
    if isinstance(rows, Mapping):
        raise ConfigError(f'image-caption rows: got a dict of splits {sorted(rows)}: pick one (e.g. '
                          "MsDataset.load(..., split='train'))")
    if is_row_stream(rows):
        if not hasattr(rows, '__iter__'):
            raise ConfigError(f'image-caption rows must be a dataset (or a list) of rows, got {type(rows).__name__}')
        return ImageCaptionStream(rows, **options)
    return ImageCaptionRows(rows, **options)
