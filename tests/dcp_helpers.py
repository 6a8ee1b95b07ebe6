"""Sharded (DCP) checkpoints for the trust tests: a real run's state written as DCP shards in
one process, and the edits an attacker who can re-seal the directory would make."""
import io
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from hookloop.checkpoint.format import load_checkpoint, save_checkpoint
from hookloop.checkpoint.sharded_files import MANIFEST_DIGEST, META_FILE, METADATA_FILE, write_shard_checksums
from hookloop.cli import build_from_config
from hookloop.dist.dcp_metadata import read_dcp_metadata

CONFIG = """
custom_imports = ['hookloop.examples.digits']
model = dict(type='DigitsMLP', hidden=8)
train_dataloader = dict(dataset=dict(type='DigitsDataset', split='train'), batch_size=512, shuffle=True)
optimizer = dict(type='SGD', lr=0.1, momentum=0.9)
max_iters = 4
device = 'cpu'
seed = 0
log_config = dict(interval=100)
checkpoint_config = dict(interval=2, by_epoch=False)
"""


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


@pytest.fixture
def config(tmp_path):
    path = tmp_path / 'cfg.py'
    path.write_text(CONFIG)
    return str(path)


def build(config, work_dir, **overrides):
    return build_from_config(config, work_dir=str(work_dir), **overrides)


def write_sharded(config, tmp_path, name='ck', manifest=True):
    """What ``save_sharded`` writes, from a single process, for the state of a real run's
    ``iter_2.pth``: DCP shards of the model and the optimizer, ``shards.sha256``,
    ``hookloop.pth`` recording the manifest's digest."""
    source = tmp_path / 'src' / 'iter_2.pth'
    if not source.exists():
        trainer = build(config, tmp_path / 'src', max_iters=2)
        try:
            trainer.train()
        finally:
            trainer.close()
    checkpoint = load_checkpoint(str(source))
    holder = build(config, tmp_path / 'holder')
    holder.close()
    holder.model.load_state_dict(checkpoint['state_dict'])
    holder.optimizer.load_state_dict(checkpoint['optimizer'])
    path = tmp_path / name
    os.makedirs(path)
    model_state, optim_state = get_state_dict(holder.model, holder.optimizer)
    dcp.save({'model': model_state, 'optimizer': optim_state}, checkpoint_id=str(path))
    rest = {k: v for k, v in checkpoint.items() if k not in ('state_dict', 'optimizer')}
    rest['sharded'] = ['model', 'optimizer']
    if manifest:
        rest[MANIFEST_DIGEST] = write_shard_checksums(str(path))
    save_checkpoint(rest, str(path / META_FILE))
    return path


def rewrite_metadata(path, edit):
    """Apply ``edit(metadata)`` to ``.metadata`` (written back with DCP's own classes only)."""
    metadata = read_dcp_metadata(str(path))
    edit(metadata)
    real = {}
    for index, info in metadata.storage_data.items():  # back to DCP's own MetadataIndex class
        from torch.distributed.checkpoint.metadata import MetadataIndex
        real[MetadataIndex(index.fqn, index.offset, index.index)] = info
    metadata.storage_data = real
    with open(path / METADATA_FILE, 'wb') as f:
        pickle.dump(metadata, f)


def reseal(path):
    """What an attacker who rewrote the files would do: fresh checksums everywhere."""
    rest = load_checkpoint(str(path / META_FILE))
    rest[MANIFEST_DIGEST] = write_shard_checksums(str(path))
    save_checkpoint(rest, str(path / META_FILE))


def append_to_shard(path, data):
    """Append ``data`` to the shard file; returns its ``(offset, length)`` there."""
    shard = path / '__0_0.distcp'
    offset = shard.stat().st_size
    with open(shard, 'ab') as f:
        f.write(data)
    return offset, len(data)


def point_item_at(path, key, data):
    """Point the storage entry of ``key`` at ``data``, appended to the shard."""
    offset, length = append_to_shard(path, data)

    def edit(metadata):
        for index, info in metadata.storage_data.items():
            if index.fqn == key:
                info.offset, info.length = offset, length
    rewrite_metadata(path, edit)


def saved(value):
    """``value`` as ``torch.save`` writes it (what DCP stores for a bytes item)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def rig_bytes_item(path, marker, key='optimizer.param_groups.0.lr'):
    """Point the bytes item ``key`` at a pickle (appended to the shard) that touches ``marker``."""
    point_item_at(path, key, saved(Payload(marker)))  # a torch.save file that needs weights_only=False
