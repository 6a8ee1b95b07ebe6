"""The work dir lock cannot be aimed at another file, nor dodged by another spelling of the dir."""
import os
import stat

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from resume_helpers import StopAt
from hookloop import Hook, Trainer
from hookloop.checkpoint.checksum import checksum_path
from hookloop.errors import ConfigError, HookloopError
from hookloop.fileio.work_dir_lock import LOCK_NAME, WorkDirLock


def make_trainer(work_dir, hooks=(), epochs=2, **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05), train_dataloader=loader, max_epochs=epochs,
                   work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=100),
                   checkpoint_config=dict(interval=2, by_epoch=False), custom_hooks=list(hooks), **kwargs)


@pytest.mark.parametrize('how', ['symlink', 'hardlink'])
def test_a_lock_file_aimed_at_another_file_leaves_it_intact(tmp_path, how):
    target = tmp_path / 'bashrc'
    target.write_bytes(b'export PATH=/precious\n' * 10)
    before = target.read_bytes()
    work_dir = tmp_path / 'work'
    work_dir.mkdir()
    (os.symlink if how == 'symlink' else os.link)(target, work_dir / LOCK_NAME)
    with pytest.raises(ConfigError, match='symbolic link|other hard links'):
        train(make_trainer(work_dir))
    assert target.read_bytes() == before


@pytest.mark.parametrize('kind', ['directory', 'fifo', 'dangling', 'foreign'])
def test_a_lock_that_is_not_a_lock_file_is_one_clear_line(tmp_path, kind):
    work_dir = tmp_path / 'work'
    work_dir.mkdir()
    lock = work_dir / LOCK_NAME
    if kind == 'directory':
        lock.mkdir()
    elif kind == 'fifo':
        os.mkfifo(lock)
    elif kind == 'dangling':
        os.symlink(tmp_path / 'nowhere', lock)
    else:
        lock.write_bytes(b'my notes, not a lock\n')
    with pytest.raises(ConfigError, match='refusing to use it as the work dir lock') as info:
        train(make_trainer(work_dir))
    assert '\n' not in str(info.value)
    if kind == 'foreign':
        assert lock.read_bytes() == b'my notes, not a lock\n'
    assert not os.path.exists(tmp_path / 'nowhere')


@pytest.mark.parametrize('first,second', [('file://{d}/run', '{d}/run'), ('file://{d}/./run/', 'file://{d}/run'),
                                          ('{d}/x/../run', '{d}/link')])
def test_two_spellings_of_one_dir_share_the_lock(tmp_path, first, second):
    d = str(tmp_path)
    os.makedirs(tmp_path / 'run')
    os.symlink(tmp_path / 'run', tmp_path / 'link')
    one = make_trainer(first.format(d=d))
    one.workspace.claim()
    try:
        with pytest.raises(ConfigError, match='is in use by another run'):
            make_trainer(second.format(d=d)).workspace.claim()
    finally:
        one.close()


class DeleteLock(Hook):
    def after_train_iter(self, trainer):
        if trainer.iter == 0:
            os.remove(os.path.join(trainer.work_dir, LOCK_NAME))


def test_a_run_whose_lock_was_deleted_stops_before_its_next_checkpoint(tmp_path):
    trainer = make_trainer(tmp_path / 'work', hooks=[DeleteLock()])
    with pytest.raises(HookloopError, match='was deleted while this run held it'):
        train(trainer)
    assert not any(name.endswith('.pth') for name in os.listdir(tmp_path / 'work'))


def test_url_mirrors_live_in_a_private_directory(tmp_path):
    from hookloop.fileio import storage
    mirror = storage.local_mirror('memory://bucket/run')
    parent = os.path.dirname(mirror)
    info = os.lstat(parent)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077
    assert storage.local_mirror('memory://bucket/run/') == mirror


def test_lock_is_keyed_on_the_real_path(tmp_path):
    os.makedirs(tmp_path / 'real')
    os.symlink(tmp_path / 'real', tmp_path / 'alias')
    assert WorkDirLock(tmp_path / 'alias').path == WorkDirLock(tmp_path / 'real' / '.').path


# -- 3. object-store keys are literal: never folded ---------------------------------------------

@pytest.fixture
def memory_fs():
    import fsspec
    fs = fsspec.filesystem('memory')
    yield fs
    if fs.exists('/hookloop-i20'):
        fs.rm('/hookloop-i20', recursive=True)


def test_a_url_work_dir_with_dot_dot_never_reaches_another_runs_keys(tmp_path, memory_fs):
    """``memory://B/x/../run`` is its own key on an object store: hookloop folded it into
    ``memory://B/run``, resumed that run and let max_keep_ckpts delete its objects."""
    other = train(make_trainer('memory://hookloop-i20/run'))
    before = sorted(memory_fs.find('/hookloop-i20/run'))
    assert any(name.endswith('.pth') for name in before)
    with pytest.raises(ConfigError, match=r'has "\." or "\.\." in its path.*literal'):
        make_trainer('memory://hookloop-i20/x/../run', resume_from='auto')
    assert sorted(memory_fs.find('/hookloop-i20/run')) == before
    memory_fs.pipe_file('/hookloop-i20/a/last_checkpoint', b'../run/iter_2.pth')
    from hookloop.checkpoint.format import read_pointer
    from hookloop.errors import CheckpointError
    with pytest.raises(CheckpointError, match='segments: refusing it'):
        read_pointer('memory://hookloop-i20/a')
    del other


# -- 7. the walk-back stays in the work dir and keeps the evidence ------------------------------

def test_walk_back_follows_no_symlink_into_another_run(tmp_path):
    train(make_trainer(tmp_path / 'other', epochs=1, hooks=[StopAt(4)]))  # other/iter_4.pth
    work_dir = tmp_path / 'run'
    train(make_trainer(work_dir, hooks=[StopAt(1)]))  # run/iter_2.pth
    os.symlink('../other/iter_4.pth', work_dir / 'iter_9.pth')
    import shutil
    shutil.copy(checksum_path(str(tmp_path / 'other' / 'iter_4.pth')), checksum_path(str(work_dir / 'iter_9.pth')))  # a valid sidecar
    (work_dir / 'iter_2.pth').write_bytes(b'')  # the run's own latest is damaged: walk back
    os.remove(work_dir / 'last_checkpoint')
    from hookloop.errors import CheckpointError
    with pytest.raises(CheckpointError, match='no usable checkpoint') as info:
        train(make_trainer(work_dir, resume_from='auto'))
    assert 'iter_9' not in str(info.value)


def test_a_damaged_checkpoint_is_renamed_aside_before_the_resumed_run_reuses_its_name(tmp_path):
    work_dir = tmp_path / 'run'
    train(make_trainer(work_dir, hooks=[StopAt(3)]))  # iter_2.pth, iter_4.pth
    damaged = (work_dir / 'iter_4.pth').read_bytes()[:-100]
    (work_dir / 'iter_4.pth').write_bytes(damaged)
    resumed = train(make_trainer(work_dir, resume_from='auto'))
    assert resumed.resumed_from == str(work_dir / 'iter_2.pth')
    assert (work_dir / 'iter_4.pth.damaged').read_bytes() == damaged  # the evidence, byte for byte
    assert os.path.exists(checksum_path(str(work_dir / 'iter_4.pth.damaged')))
    assert (work_dir / 'iter_4.pth').read_bytes() != damaged  # the resumed run wrote its own iter_4
