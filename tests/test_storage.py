"""Work dirs and checkpoint dirs behind fsspec URLs: ``memory://`` and a real S3 API (moto's
server on 127.0.0.1). Checkpoints, the pointer and the logs go there; retention and
``--resume auto`` work; a killed run resumes bitwise; an unknown protocol is one line."""
import os
import signal
import socket
import time

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Hook, Trainer
from hookloop.checkpoint.checksum import checksum_path
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.errors import CheckpointError, ConfigError
from resume_helpers import CONFIG, assert_states_equal, comparable, kill_leftovers, launch, reference_run

fsspec = pytest.importorskip('fsspec')


def make_trainer(work_dir, checkpoint=None, extra_hooks=(), **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8, shuffle=True)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                   max_epochs=3, work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=5),
                   checkpoint_config=checkpoint or dict(interval=1, by_epoch=False, max_keep_ckpts=2),
                   custom_hooks=[dict(type='EMAHook', momentum=0.1, warm_up=1), *extra_hooks], **kwargs)


class StopAfter(Hook):
    def __init__(self, n):
        self.n = n

    def after_train_iter(self, trainer):
        if trainer.iter + 1 == self.n:
            trainer.request_stop('test')


def names(fs, root):
    fs.invalidate_cache()
    return sorted(os.path.basename(p) for p in fs.ls(root, detail=False))


@pytest.fixture
def memory_fs():
    fs = fsspec.filesystem('memory')
    yield fs
    if fs.exists('/hookloop-test'):
        fs.rm('/hookloop-test', recursive=True)


@pytest.mark.parametrize('async_save', [False, True], ids=['sync', 'async'])
def test_memory_work_dir_resume_auto_and_retention(tmp_path, monkeypatch, memory_fs, async_save):
    monkeypatch.chdir(tmp_path)  # nothing may appear in the current directory (no 'memory:' folder)
    url = 'memory://hookloop-test/run'
    checkpoint = dict(interval=1, by_epoch=False, max_keep_ckpts=2, async_save=async_save)
    train(make_trainer(url, checkpoint, extra_hooks=[StopAfter(6)]))
    assert read_pointer(url) == url + '/iter_6.pth'
    resumed = train(make_trainer(url, checkpoint, resume_from='auto'))
    files = names(memory_fs, '/hookloop-test/run')
    assert [n for n in files if n.endswith('.pth')] == ['iter_14.pth', 'iter_15.pth']
    assert 'last_checkpoint' in files and f'{resumed.timestamp}.log.json' in files  # logs copied there
    assert not [n for n in files if n.endswith('.tmp')]
    reference = train(make_trainer(str(tmp_path / 'reference'), checkpoint))
    assert_states_equal(comparable(load_checkpoint(read_pointer(url))),
                        comparable(load_checkpoint(read_pointer(reference.work_dir))))
    assert os.listdir(tmp_path) == ['reference']


def test_unknown_protocol_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^'nosuchfs://bucket/run': unknown storage protocol 'nosuchfs'") as info:
        make_trainer('nosuchfs://bucket/run')
    assert '\n' not in str(info.value)
    trainer = make_trainer(str(tmp_path / 'w'), dict(interval=1, out_dir='nosuchfs://bucket/ckpt'))
    with pytest.raises(ConfigError, match='unknown storage protocol'):
        trainer.train()
    trainer.close()
    assert not os.path.exists(tmp_path / 'nosuchfs:') and not os.path.exists(tmp_path / 'w' / 'nosuchfs:')


# -- a real S3 API: moto's server ------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def s3_endpoint():
    pytest.importorskip('s3fs')
    server_module = pytest.importorskip('moto.server')
    server = server_module.ThreadedMotoServer(ip_address='127.0.0.1', port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f'http://{host}:{port}'
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """An s3fs filesystem on the moto server with a fresh bucket; this process's fsspec and
    child processes (through the environment) are pointed at the server."""
    for name, value in (('AWS_ACCESS_KEY_ID', 'testing'), ('AWS_SECRET_ACCESS_KEY', 'testing'),
                        ('AWS_DEFAULT_REGION', 'us-east-1'), ('FSSPEC_S3_ENDPOINT_URL', s3_endpoint)):
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, 's3', {'endpoint_url': s3_endpoint})
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint)
    bucket = f'run-{time.monotonic_ns()}'
    fs.mkdir(bucket)
    yield fs, bucket
    s3fs.S3FileSystem.clear_instance_cache()


def test_checkpoint_out_dir_on_s3_writes_no_local_folder(tmp_path, monkeypatch, s3):
    """Before, ``out_dir='s3://bucket/run'`` silently wrote into a local folder named ``s3:``."""
    fs, bucket = s3
    monkeypatch.chdir(tmp_path)
    work_dir = tmp_path / 'work'
    trainer = train(make_trainer(str(work_dir), dict(interval=1, out_dir=f's3://{bucket}/ckpt', max_keep_ckpts=2)))
    sidecar = checksum_path('')
    assert names(fs, f'{bucket}/ckpt') == ['epoch_2.pth', 'epoch_2.pth' + sidecar, 'epoch_3.pth', 'epoch_3.pth' + sidecar]
    # the pointer stays in the work dir; it names the hook's out_dir, which read_pointer is told of
    assert read_pointer(str(work_dir), also_inside=[f's3://{bucket}/ckpt']) == f's3://{bucket}/ckpt/epoch_3.pth'
    with pytest.raises(CheckpointError, match='outside the work dir'):
        read_pointer(str(work_dir))
    assert_states_equal(load_checkpoint(f's3://{bucket}/ckpt/epoch_3.pth')['state_dict'], trainer.model.state_dict())
    assert sorted(os.listdir(tmp_path)) == ['work'] and not any('s3:' in n for n in os.listdir(work_dir))


S3_CONFIG = CONFIG.replace("checkpoint_config = dict(interval={interval}, by_epoch=False{checkpoint_extra})",
                           "checkpoint_config = dict(interval=1, by_epoch=False, max_keep_ckpts=2{checkpoint_extra})")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_s3_train_kill_resume_auto_is_bitwise(tmp_path, s3):
    """``hookloop train CONFIG --work-dir s3://bucket/run --resume auto`` in a process that is
    killed with SIGKILL mid-run, then run again: it resumes from the S3 pointer, keeps two
    checkpoints, and ends bitwise equal to an uninterrupted local run."""
    fs, bucket = s3
    config = tmp_path / 'config.py'
    config.write_text(S3_CONFIG.format(big=0, delay=0.02, num_workers=0, max_epochs=4, checkpoint_extra=''))
    url = f's3://{bucket}/run'
    try:
        killed = launch(str(config), url)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and killed.poll() is None:
            latest = read_pointer(url)
            if latest is not None and load_checkpoint(latest)['meta']['iter'] >= 3:
                break
            time.sleep(0.05)
        assert killed.poll() is None, killed.communicate()[0].decode()[-3000:]
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        at_kill = load_checkpoint(read_pointer(url))['meta']['iter']
        assert 3 <= at_kill < 20
        resumed = launch(str(config), url)
        output = resumed.communicate(timeout=180)[0].decode()
        assert resumed.returncode == 0, output[-3000:]
    finally:
        kill_leftovers()
    assert f'resumed from {url}/iter_' in output
    assert [n for n in names(fs, f'{bucket}/run') if n.endswith('.pth')] == ['iter_19.pth', 'iter_20.pth']
    final = load_checkpoint(read_pointer(url))
    assert final['meta']['iter'] == 20
    reference = reference_run(str(config), tmp_path / 'reference')
    assert_states_equal(comparable(final), comparable(load_checkpoint(read_pointer(reference.work_dir))))
    assert not os.path.exists('s3:')


# -- trust (issue 12) on a URL storage dir ---------------------------------------------------
@pytest.mark.parametrize('async_save', [False, True], ids=['sync', 'async'])
def test_memory_sidecars_relative_pointer_and_walk_back(tmp_path, monkeypatch, memory_fs, async_save):
    """On ``memory://`` every checkpoint gets its checksum sidecar (async saves too), the pointer holds
    a plain file name, a damaged latest fails verification and ``--resume auto`` walks back."""
    monkeypatch.chdir(tmp_path)
    url = 'memory://hookloop-test/trust'
    checkpoint = dict(interval=1, by_epoch=False, max_keep_ckpts=3, async_save=async_save)
    train(make_trainer(url, checkpoint, extra_hooks=[StopAfter(6)]))
    files = names(memory_fs, '/hookloop-test/trust')
    assert [n for n in files if n.endswith('.pth')] == ['iter_4.pth', 'iter_5.pth', 'iter_6.pth']
    assert all(checksum_path(n) in files for n in files if n.endswith('.pth'))
    assert memory_fs.cat_file('/hookloop-test/trust/last_checkpoint') == b'iter_6.pth'
    assert read_pointer(url) == url + '/iter_6.pth'
    # flip one byte of the latest: load refuses it, --resume auto falls back to iter_5
    data = bytearray(memory_fs.cat_file('/hookloop-test/trust/iter_6.pth'))
    data[len(data) // 2] ^= 0xFF
    memory_fs.pipe_file('/hookloop-test/trust/iter_6.pth', bytes(data))
    with pytest.raises(CheckpointError, match='(XXH128|SHA-256) does not match'):
        load_checkpoint(url + '/iter_6.pth')
    resumed = make_trainer(url, checkpoint, resume_from='auto')
    path, found = resumed.checkpointer.resume_target()
    resumed.close()
    assert path == url + '/iter_5.pth' and found['meta']['iter'] == 5


def test_url_pointer_outside_the_storage_dir_is_refused(memory_fs):
    memory_fs.pipe_file('/hookloop-test/a/last_checkpoint', b'../b/iter_1.pth')
    with pytest.raises(CheckpointError, match=r'"\.\." segments: refusing it'):  # keys are literal: never folded
        read_pointer('memory://hookloop-test/a')
    memory_fs.pipe_file('/hookloop-test/a/last_checkpoint', b'memory://hookloop-test/ab/iter_1.pth')
    with pytest.raises(CheckpointError, match='outside the work dir'):
        read_pointer('memory://hookloop-test/a')
    assert read_pointer('memory://hookloop-test/a', also_inside=['memory://hookloop-test/ab']) == \
        'memory://hookloop-test/ab/iter_1.pth'
