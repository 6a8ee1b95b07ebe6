"""``MsDataset.load`` for a local dataset directory, as ModelScope's examples call it.

A directory holds one file per split, named after it: ``train.csv``, ``validation.jsonl``,
``test.json`` ... (CSV with a header row, JSON lines, or a JSON list of objects). Each row is a
dict of its columns; the values of a ``:FILE`` column (``Target:FILE``) are paths relative to the
directory and are made absolute, as ModelScope resolves them. Nothing is downloaded: a name that
is not a local directory is refused in one line that says how to get it.
"""
import csv
import json
import os

from torch.utils.data import Dataset

from ..errors import ConfigError

_SUFFIXES = ('.csv', '.jsonl', '.json')


class MsDataset(Dataset):
    """The rows of one split of a local dataset (a map-style dataset of dicts)."""

    def __init__(self, rows, split=None, root=None):
        self.rows, self.split, self.root = list(rows), split, root

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]

    def __repr__(self):
        return f'MsDataset(split={self.split!r}, {len(self.rows)} rows, from {self.root!r})'

    @classmethod
    def load(cls, dataset_name, namespace=None, subset_name=None, split=None, download_mode=None, **kwargs):
        """The split ``split`` of the local directory ``dataset_name`` (with one split file and
        ``split=None``, that split; with several, ``{split: MsDataset}``, as ModelScope returns them).
        ``download_mode``, ``namespace`` and hub options have nothing to do for a local directory."""
        directory = os.fspath(dataset_name)
        if not os.path.isdir(directory):
            name = f'{namespace}/{directory}' if namespace else directory
            raise ConfigError(f'MsDataset.load: {name!r} is not a local directory; hookloop does not download from '
                              f'the ModelScope hub: download it first (e.g. `modelscope download --dataset {name} '
                              '--local_dir DIR`) and load DIR')
        if subset_name is not None:
            directory = os.path.join(directory, subset_name)
        files = {}
        for name in sorted(os.listdir(directory)):
            stem, suffix = os.path.splitext(name)
            if suffix in _SUFFIXES and not name.startswith('.'):
                files.setdefault(stem, os.path.join(directory, name))
        if not files:
            raise ConfigError(f'MsDataset.load: {directory!r} has no split file ({", ".join(_SUFFIXES)}, named '
                              'after the split: train.csv, validation.csv, ...)')
        if split is not None:
            if split not in files:
                raise ConfigError(f'MsDataset.load: {directory!r} has no split {split!r}; it has {sorted(files)}')
            return cls(_read(files[split], directory), split, directory)
        loaded = {name: cls(_read(path, directory), name, directory) for name, path in files.items()}
        return next(iter(loaded.values())) if len(loaded) == 1 else loaded


def _read(path, root):
    with open(path, encoding='utf-8', newline='') as f:
        if path.endswith('.csv'):
            rows = list(csv.DictReader(f))
        elif path.endswith('.jsonl'):
            rows = [json.loads(line) for line in f if line.strip()]
        else:
            rows = json.load(f)
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ConfigError(f'MsDataset.load: {path!r} must hold rows (objects with the same columns)')
    return [{key: _resolved(key, value, root) for key, value in row.items()} for row in rows]


def _resolved(key, value, root):
    if key.endswith(':FILE') and isinstance(value, str) and value and not os.path.isabs(value):
        return os.path.join(root, value)
    return value


__all__ = ['MsDataset']
