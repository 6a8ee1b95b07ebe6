"""``mmcv.fileio.file_client``: ``FileClient`` over hookloop's storage (a local disk or an
fsspec URL such as ``s3://bucket/key``), and ``PetrelBackend``, refused: hookloop does not
talk to Petrel clusters (``petrel_client``); it reaches S3 through fsspec."""
import contextlib
import os
import tempfile

from ....errors import ConfigError
from ....fileio import storage
from ....checkpoint import atomic


class PetrelBackend:
    """MMCV's Petrel (``petrel_client``) backend: not supported by hookloop."""

    def __init__(self, *args, **kwargs):
        raise ConfigError('PetrelBackend (petrel_client) is not supported: hookloop reads and writes s3:// through '
                          'fsspec (s3fs), with fsspec\'s credentials and endpoint settings')


class FileClient:
    """MMCV's ``FileClient(backend='disk')`` for local paths and fsspec URLs: ``get``,
    ``get_text``, ``put`` (atomic), ``put_text``, ``remove``, ``exists``, ``isfile``,
    ``isdir``, ``join_path``, ``get_local_path``. Other backends are refused."""

    _instances = {}
    _backends = ('disk', 'local')

    def __init__(self, backend=None, prefix=None, **kwargs):
        if backend not in (None,) + self._backends or prefix not in (None, 'file'):
            raise ConfigError(f'FileClient backend {backend!r} (prefix {prefix!r}) is not supported: hookloop reads '
                              'local paths and fsspec URLs (s3://, gs://, memory://...) with backend="disk"')
        self.backend = backend or 'disk'

    @classmethod
    def infer_client(cls, file_client_args=None, uri=None):
        return cls(**(file_client_args or {}))

    def get(self, filepath):
        return storage.read_bytes(str(filepath))

    def get_text(self, filepath, encoding='utf-8'):
        return self.get(filepath).decode(encoding)

    def put(self, obj, filepath):
        path = str(filepath)
        storage.makedirs(storage.dirname(path) or '.')
        atomic.atomic_write(path, lambda file: file.write(obj))

    def put_text(self, obj, filepath, encoding='utf-8'):
        self.put(obj.encode(encoding), filepath)

    def remove(self, filepath):
        storage.remove(str(filepath))

    def exists(self, filepath):
        return storage.exists(str(filepath))

    def isfile(self, filepath):
        return storage.isfile(str(filepath))

    def isdir(self, filepath):
        return storage.isdir(str(filepath))

    def join_path(self, filepath, *filepaths):
        path = str(filepath)
        for name in filepaths:
            path = storage.join(path, name)
        return path

    @contextlib.contextmanager
    def get_local_path(self, filepath):
        """A local path to read ``filepath`` from (a URL is downloaded to a temporary file)."""
        path = str(filepath)
        if not storage.is_url(path):
            yield path
            return
        with tempfile.TemporaryDirectory() as directory:
            local = os.path.join(directory, storage.basename(path))
            with open(local, 'wb') as file:
                file.write(self.get(path))
            yield local


__all__ = ['FileClient', 'PetrelBackend']
