"""Trust in checkpoint files: no code runs from a sharded directory, damage is detected and
survived, a work dir belongs to one run and never touches another run's files."""
import os
import pickle
import shutil
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Hook, Trainer
from hookloop.fileio import hashing
from hookloop.checkpoint.checksum import checksum_path
from hookloop.checkpoint.format import POINTER_NAME, load_checkpoint, read_pointer, save_checkpoint, update_pointer
from hookloop.dist.dcp_metadata import read_dcp_metadata
from hookloop.errors import CheckpointError, ConfigError
from hookloop.checkpoint.sharded_files import META_FILE, write_shard_checksums
from resume_helpers import ForkedRun, assert_states_equal, kill_leftovers, write_config


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    kill_leftovers()


class StopAt(Hook):
    """Requests a stop after iteration ``at`` (0-based), as a preemption would."""

    def __init__(self, at):
        self.at = at

    def after_train_iter(self, trainer):
        if trainer.iter == self.at:
            trainer.request_stop(f'test stop at {self.at}')


def make_trainer(work_dir, epochs=2, hooks=(), checkpoint=None, **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8, shuffle=True)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                   max_epochs=epochs, work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=100),
                   checkpoint_config=checkpoint or dict(interval=1, by_epoch=False), custom_hooks=list(hooks),
                   **kwargs)


def snapshot(directory):
    """Every file under ``directory`` with its bytes (for a byte-for-byte comparison)."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, 'rb') as f:
                files[os.path.relpath(path, directory)] = f.read()
    return files


# -- 1. no code from a sharded directory -----------------------------------------------------

class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))


def rigged_sharded_dir(path, metadata_bytes):
    """A directory that looks like a hookloop FSDP checkpoint: a clean ``hookloop.pth``
    (it passes ``weights_only``) beside a ``.metadata`` of the attacker's choosing."""
    os.makedirs(path)
    meta = {'epoch': 0, 'iter': 1, 'inner_iter': 1, 'seed': 0, 'world_size': 1}
    save_checkpoint({'meta': meta, 'hooks': {}, 'sharded': ['model']}, os.path.join(path, META_FILE))
    with open(os.path.join(path, '.metadata'), 'wb') as f:
        f.write(metadata_bytes)
    return str(path)


def test_rigged_sharded_metadata_runs_no_code_via_resume_from_auto_and_ema(tmp_path, monkeypatch):
    monkeypatch.setenv('HOOKLOOP_ALLOW_UNVERIFIED', '1')  # no shards.sha256: reach .metadata itself
    marker = tmp_path / 'pwned'
    rigged = pickle.dumps(Payload(marker))
    refused = r"refusing to load .*\.metadata.*references (posix|os)\.system"

    evil = rigged_sharded_dir(tmp_path / 'evil', rigged)
    with pytest.raises(CheckpointError, match=refused):
        train(make_trainer(tmp_path / 'a', resume_from=evil))

    # --resume auto: last_checkpoint names a rigged directory inside the work dir.
    rigged_sharded_dir(tmp_path / 'b' / 'iter_1.pth', rigged)
    update_pointer(str(tmp_path / 'b'), str(tmp_path / 'b' / 'iter_1.pth'))
    trainer = make_trainer(tmp_path / 'b', resume_from='auto')
    with pytest.raises(CheckpointError, match='no usable checkpoint.*references (posix|os).system'):
        train(trainer)

    with pytest.raises(CheckpointError, match=refused):
        train(make_trainer(tmp_path / 'c', hooks=[dict(type='EMAHook', resume_from=evil)]))
    assert not marker.exists()


def test_random_bytes_as_metadata_are_not_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv('HOOKLOOP_ALLOW_UNVERIFIED', '1')
    noise = rigged_sharded_dir(tmp_path / 'noise', os.urandom(300))
    with pytest.raises(CheckpointError, match='not a checkpoint metadata file'):
        read_dcp_metadata(noise)
    with pytest.raises(CheckpointError, match='not a checkpoint metadata file'):
        train(make_trainer(tmp_path / 'run', resume_from=noise))


def test_real_sharded_checkpoint_loads_through_the_restricted_reader(tmp_path):
    """A directory DCP really wrote (single process) passes the allow-list and resumes."""
    source = train(make_trainer(tmp_path / 'src', epochs=1))
    path = tmp_path / 'sharded'
    os.makedirs(path)
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(source.model, source.optimizer)
    dcp.save({'model': model_state, 'optimizer': optim_state}, checkpoint_id=str(path))
    digest = write_shard_checksums(str(path))
    rest = {k: v for k, v in source.state_dict().items() if k not in ('state_dict', 'optimizer')}
    save_checkpoint(dict(rest, sharded=['model', 'optimizer'], shards_digest=digest), str(path / META_FILE))
    read_dcp_metadata(str(path))
    resumed = train(make_trainer(tmp_path / 'dst', epochs=2, resume_from=str(path)))
    reference = train(make_trainer(tmp_path / 'ref', epochs=2))
    assert_states_equal(resumed.model.state_dict(), reference.model.state_dict())
    # A flipped byte in a shard is caught by the shard checksums.
    shard = next(p for p in path.iterdir() if p.suffix == '.distcp')
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r'__0_0\.distcp.* is damaged'):
        train(make_trainer(tmp_path / 'dst2', epochs=2, resume_from=str(path)))


# -- 2. integrity ------------------------------------------------------------------------------

def test_every_checkpoint_has_a_checksum_and_a_flipped_byte_is_detected(tmp_path):
    train(make_trainer(tmp_path / 'run', epochs=1))
    path = tmp_path / 'run' / 'iter_5.pth'
    digest, name = open(checksum_path(str(path))).read().split()
    assert name == 'iter_5.pth' and len(digest) == {'xxh128': 32, 'sha256': 64}[hashing.default_algorithm()]
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10  # one bit, in the middle of the tensor data
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"iter_5\.pth' is damaged: its (XXH128|SHA-256) does not match"):
        load_checkpoint(str(path))
    with pytest.raises(CheckpointError, match=r"iter_5\.pth' is damaged"):  # resume_from=PATH: one error
        train(make_trainer(tmp_path / 'other', resume_from=str(path)))


def test_checkpoint_files_honour_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        train(make_trainer(tmp_path / 'run', epochs=1))
    finally:
        os.umask(previous)
    mode = os.stat(tmp_path / 'run' / 'iter_5.pth').st_mode & 0o777
    assert mode == 0o640, oct(mode)


@pytest.mark.parametrize('damage', ['zero_bytes', 'truncated', 'flipped_byte'])
def test_resume_auto_falls_back_past_a_damaged_latest_and_ends_bitwise_equal(tmp_path, damage, capsys):
    reference = train(make_trainer(tmp_path / 'ref', epochs=2))
    work_dir = tmp_path / 'run'
    train(make_trainer(work_dir, epochs=2, hooks=[StopAt(6)]))
    latest = read_pointer(work_dir)
    assert latest == str(work_dir / 'iter_7.pth')
    data = bytearray(open(latest, 'rb').read())
    damaged = {'zero_bytes': b'', 'truncated': bytes(data[:len(data) // 2]),
               'flipped_byte': bytes(data[:100]) + bytes([data[100] ^ 1]) + bytes(data[101:])}[damage]
    with open(latest, 'wb') as f:
        f.write(damaged)
    resumed = make_trainer(work_dir, epochs=2, resume_from='auto')
    capsys.readouterr()
    resumed.train()
    resumed.close()
    assert resumed.resumed_from == str(work_dir / 'iter_6.pth')
    assert f'--resume auto: skipped {work_dir / "iter_7.pth"}: ' in capsys.readouterr().out
    assert_states_equal(resumed.model.state_dict(), reference.model.state_dict())
    assert_states_equal(load_checkpoint(read_pointer(work_dir))['state_dict'], reference.model.state_dict())


def test_damaged_pointer_is_survived_and_damaged_checkpoints_are_kept(tmp_path):
    work_dir = tmp_path / 'run'
    train(make_trainer(work_dir, epochs=2, hooks=[StopAt(6)]))
    (work_dir / POINTER_NAME).write_bytes(b'\xff\xfe\x00garbage')
    (work_dir / 'iter_7.pth').write_bytes(b'')
    trainer = make_trainer(work_dir, epochs=1, resume_from='auto')  # 6 iterations done of 5: complete
    trainer.train()
    trainer.close()
    assert (work_dir / 'iter_7.pth.damaged').exists()  # set aside for the user to look at
    with pytest.raises(CheckpointError, match='not UTF-8'):
        read_pointer(work_dir)


def test_resuming_a_finished_run_says_so_and_writes_nothing(tmp_path, capsys):
    work_dir = tmp_path / 'run'
    train(make_trainer(work_dir, epochs=1))
    before = snapshot(work_dir)
    train(make_trainer(work_dir, epochs=1, resume_from='auto'))
    assert 'already complete at epoch 1 / iteration 5' in capsys.readouterr().out
    assert snapshot(work_dir) == before


# -- 3. a work dir is one run's --------------------------------------------------------------

def test_copied_work_dir_resumes_from_its_own_files_and_original_is_unchanged(tmp_path):
    original, copy = tmp_path / 'original', tmp_path / 'copy'
    keep = dict(interval=1, by_epoch=False, max_keep_ckpts=2)
    train(make_trainer(original, epochs=2, hooks=[StopAt(6)], checkpoint=keep))
    shutil.copytree(original, copy)
    before = snapshot(original)
    resumed = train(make_trainer(copy, epochs=2, resume_from='auto', checkpoint=keep))
    assert resumed.resumed_from == str(copy / 'iter_7.pth')
    assert snapshot(original) == before
    assert sorted(n for n in os.listdir(copy) if n.endswith('.pth')) == ['iter_10.pth', 'iter_9.pth']
    assert (copy / POINTER_NAME).read_text() == 'iter_10.pth'  # relative


def test_resume_from_another_runs_checkpoint_leaves_that_run_untouched(tmp_path):
    other, mine = tmp_path / 'other', tmp_path / 'mine'
    keep = dict(interval=1, by_epoch=False, max_keep_ckpts=1)
    train(make_trainer(other, epochs=2, hooks=[StopAt(6)], checkpoint=keep))
    before = snapshot(other)
    resumed = train(make_trainer(mine, epochs=2, resume_from=str(other / 'iter_7.pth'), checkpoint=keep))
    assert resumed.iter == 10
    assert snapshot(other) == before
    assert sorted(n for n in os.listdir(mine) if n.endswith('.pth')) == ['iter_10.pth']


def test_pointer_naming_a_path_outside_the_work_dir_is_refused(tmp_path):
    other = tmp_path / 'other'
    train(make_trainer(other, epochs=1))
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / POINTER_NAME).write_text(str(other / 'iter_5.pth'))
    before = snapshot(other)
    trainer = make_trainer(mine, epochs=2, resume_from='auto')
    with pytest.raises(CheckpointError, match='outside the work dir'):
        train(trainer)
    assert snapshot(other) == before


class SignalAt(Hook):
    def __init__(self, at):
        self.at = at

    def before_train_iter(self, trainer):
        if trainer.iter == self.at:
            import signal
            os.kill(os.getpid(), signal.SIGTERM)


def test_max_keep_ckpts_one_over_three_resumes_leaves_one_checkpoint_and_best(tmp_path):
    work_dir = tmp_path / 'run'
    val = DataLoader(regression_data(n=8, seed=1), batch_size=8)
    losses = iter([5.0, 4.0, 6.0, 7.0, 8.0, 9.0])
    keep = dict(interval=1, max_keep_ckpts=1, save_best='loss', rule='less')
    for stop_at in (3, 9, 14, None):
        hooks = [dict(type='PreemptionHook')] + ([SignalAt(stop_at)] if stop_at is not None else [])
        train(make_trainer(work_dir, epochs=4, hooks=hooks, checkpoint=keep, resume_from='auto',
                           val_dataloader=val, val_evaluator=lambda outputs, batch: {'loss': next(losses)}))
    names = sorted(n for n in os.listdir(work_dir) if n.endswith('.pth'))
    assert names == ['best_loss_epoch_2.pth', 'epoch_4.pth'], names


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_second_run_on_a_live_work_dir_is_refused_while_the_first_finishes(tmp_path):
    config = write_config(tmp_path, delay=0.01, max_epochs=2, interval=1000)  # ~0.1 s per iteration
    work_dir = tmp_path / 'run'
    first = ForkedRun(config, work_dir, str(tmp_path / 'first.log'))
    deadline = time.monotonic() + 120
    lock = work_dir / '.hookloop.lock'
    while not (lock.exists() and lock.read_text().strip()):
        assert first.poll() is None and time.monotonic() < deadline, first.output()[-3000:]
        time.sleep(0.05)
    second = ForkedRun(config, work_dir, str(tmp_path / 'second.log'))
    assert second.wait(timeout=60) == 1
    message = second.output()
    assert f'is in use by another run (pid {first.pid} on host {os.uname().nodename})' in message, message
    assert 'Traceback' not in message
    assert first.poll() is None  # still training, untouched
    assert first.wait(timeout=180) == 0, first.output()[-3000:]
    assert load_checkpoint(read_pointer(work_dir))['meta']['iter'] == 10


def test_lock_is_released_at_the_end_of_a_run_so_the_next_run_may_start(tmp_path):
    first = make_trainer(tmp_path, epochs=1)
    first.train()  # not closed: the run itself releases the lock
    train(make_trainer(tmp_path, epochs=2, resume_from='auto'))
    first.close()


def test_config_error_leaves_no_work_dir(tmp_path):
    work_dir = tmp_path / 'never'
    with pytest.raises(ConfigError):
        Trainer(Regressor(), optimizer=dict(type='NoSuchOptimizer'), train_dataloader=DataLoader(regression_data()),
                max_epochs=1, work_dir=work_dir, device='cpu')
    assert not work_dir.exists()
