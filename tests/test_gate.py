"""The weight-export gate (issue 36, "one gate for every file that holds trained weights"):
finite, atomic, with a checksum sidecar, for single files and whole directories, through the
gate's functions and the trainer's ``checkpointer.export_file`` / ``export_directory``."""
import math
import os

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from hookloop import Trainer
from hookloop.checkpoint import gate
from hookloop.checkpoint.atomic import TMP_SUFFIX, remove_stale_temporaries
from hookloop.checkpoint.checksum import verify_checksum
from hookloop.checkpoint.finite_state import FiniteBaseline
from hookloop.errors import CheckpointError, InvalidLossError
from hookloop.fileio.hashing import default_algorithm

SIDE = '.' + default_algorithm()
CAUSAL = torch.nn.Transformer.generate_square_subsequent_mask(4)  # 0 below the diagonal, -inf above


def leftovers(directory):
    """Temporaries a writer left beside its target."""
    return [n for n in os.listdir(directory) if n.endswith(TMP_SUFFIX)]


def write_bytes(data):
    return lambda f: f.write(data)


def test_export_file_writes_the_file_with_its_sidecar(tmp_path):
    path = str(tmp_path / 'w.bin')
    assert gate.export_file(path, write_bytes(b'weights'), {'w': torch.ones(3)}) == path
    assert open(path, 'rb').read() == b'weights'
    assert verify_checksum(path) and os.path.isfile(path + SIDE)
    assert leftovers(tmp_path) == []


def test_export_file_refuses_non_finite_weights_before_writing_anything(tmp_path):
    path = str(tmp_path / 'w.bin')
    gate.export_file(path, write_bytes(b'good'), {'w': torch.ones(3)})
    calls = []
    with pytest.raises(InvalidLossError, match=r'not saving .*w\.bin: the weights are not finite \(NaN/inf in '
                                               r'value layer\.w\)'):
        gate.export_file(path, lambda f: calls.append(f), {'layer': {'w': torch.tensor([1.0, math.nan])}})
    assert calls == [] and open(path, 'rb').read() == b'good' and verify_checksum(path)
    assert leftovers(tmp_path) == []


def test_export_accepts_what_the_baseline_held_and_nothing_else(tmp_path):
    baseline = FiniteBaseline.of({'state_dict': {'attn.mask': CAUSAL, 'w': torch.ones(2)},
                                  'hooks': {'EarlyStop': {'best': math.inf}}})
    path = str(tmp_path / 'w.bin')
    gate.export_file(path, write_bytes(b'x'), {'attn.mask': CAUSAL.clone(), 'w': torch.zeros(2)}, baseline)
    moved = CAUSAL.clone()
    moved[0, 0] = -math.inf  # a new -inf where the mask had 0
    for bad in ({'attn.mask': moved}, {'attn.mask': CAUSAL.nan_to_num(posinf=math.inf, neginf=math.inf)},
                {'w': torch.tensor([math.inf, 0.0])}, {'other.mask': CAUSAL}):
        with pytest.raises(InvalidLossError):
            gate.export_file(path, write_bytes(b'y'), bad, baseline)
    assert open(path, 'rb').read() == b'x'


def test_export_directory_swaps_a_complete_directory_in_each_file_with_its_sidecar(tmp_path):
    target = tmp_path / 'pipeline'
    target.mkdir()
    (target / 'old.bin').write_bytes(b'old')

    def write(directory):
        assert os.path.dirname(directory) == str(tmp_path) and os.path.basename(directory).startswith('.pipeline.')
        os.makedirs(os.path.join(directory, 'unet'))
        open(os.path.join(directory, 'config.json'), 'w').write('{}')
        open(os.path.join(directory, 'unet', 'w.safetensors'), 'wb').write(b'w')

    assert gate.export_directory(str(target), write, {'w': torch.ones(1)}) == str(target)
    assert sorted(os.listdir(target)) == ['config.json', 'config.json' + SIDE, 'unet']
    assert sorted(os.listdir(target / 'unet')) == ['w.safetensors', 'w.safetensors' + SIDE]
    assert verify_checksum(str(target / 'unet' / 'w.safetensors'))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize('exchange', [True, False], ids=['renameat2', 'two-renames'])
def test_a_failed_directory_export_keeps_the_previous_directory(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(gate, '_exchange', lambda a, b: False)
    target = tmp_path / 'pipeline'
    gate.export_directory(str(target), lambda d: open(os.path.join(d, 'a.bin'), 'wb').write(b'1'), {})

    def fails(directory):
        open(os.path.join(directory, 'a.bin'), 'wb').write(b'half')
        raise OSError(28, 'No space left on device')

    with pytest.raises(CheckpointError, match='could not write weights directory .*No space left on device'):
        gate.export_directory(str(target), fails, {})
    assert (target / 'a.bin').read_bytes() == b'1' and verify_checksum(str(target / 'a.bin'))
    gate.export_directory(str(target), lambda d: open(os.path.join(d, 'b.bin'), 'wb').write(b'2'), {})
    assert sorted(os.listdir(target)) == ['b.bin', 'b.bin' + SIDE]
    assert leftovers(tmp_path) == []


def test_export_directory_refuses_non_finite_weights_and_symbolic_links(tmp_path):
    target = tmp_path / 'pipeline'
    with pytest.raises(InvalidLossError):
        gate.export_directory(str(target), lambda d: None, {'w': torch.tensor(math.nan)})
    with pytest.raises(CheckpointError, match='symbolic link'):
        gate.export_directory(str(target), lambda d: os.symlink('/etc/passwd', os.path.join(d, 'w.bin')), {})
    assert not target.exists() and leftovers(tmp_path) == []


def test_a_directory_left_by_a_killed_export_is_removed_with_the_stale_temporaries(tmp_path):
    stale = tmp_path / ('.pipeline.abc' + TMP_SUFFIX)
    (stale / 'unet').mkdir(parents=True)
    (stale / 'unet' / 'w.bin').write_bytes(b'half')
    assert remove_stale_temporaries(str(tmp_path)) == [str(stale)]
    assert os.listdir(tmp_path) == []


class Masked(Regressor):
    """A regressor carrying a causal-mask buffer (0 / -inf) that training never changes."""

    def __init__(self):
        super().__init__()
        self.register_buffer('mask', CAUSAL.clone())


def make_trainer(tmp_path, model, **kwargs):
    return Trainer(model, optimizer=dict(type='SGD', lr=0.05), train_dataloader=DataLoader(regression_data(), 8),
                   max_iters=2, work_dir=str(tmp_path), seed=0, device='cpu', log_config=dict(interval=100), **kwargs)


def test_the_checkpointers_exports_are_relative_to_the_work_dir_and_use_the_runs_baseline(tmp_path):
    trainer = make_trainer(tmp_path, Masked())
    trainer.train()
    state = trainer.model.state_dict()
    path = trainer.checkpointer.export_file('exports/w.bin', write_bytes(b'w'), state)
    assert path == str(tmp_path / 'exports' / 'w.bin') and verify_checksum(path)
    directory = trainer.checkpointer.export_directory('exports/dir', lambda d: None, state)
    assert directory == str(tmp_path / 'exports' / 'dir')
    with torch.no_grad():
        trainer.model.net[0].weight[0, 0] = math.nan
    with pytest.raises(InvalidLossError, match=r'net\.0\.weight'):
        trainer.checkpointer.export_file('exports/w.bin', write_bytes(b'nan'), trainer.model.state_dict())
    assert open(path, 'rb').read() == b'w'
    trainer.close()


def test_checkpoint_hooks_safetensors_export_goes_through_the_gate(tmp_path):
    pytest.importorskip('safetensors')
    trainer = make_trainer(tmp_path, Masked(), checkpoint_config=dict(interval=1, by_epoch=False,
                                                                       export_safetensors=True))
    trainer.train()
    trainer.close()
    assert verify_checksum(str(tmp_path / 'iter_2.safetensors'))
    from safetensors.torch import load_file
    assert torch.equal(load_file(str(tmp_path / 'iter_2.safetensors'))['mask'], CAUSAL)


def test_mmcv_save_checkpoint_goes_through_the_gate(tmp_path):
    from hookloop.compat.mmcv import save_checkpoint
    model = Masked()  # no run trained it: its buffers are by design, its parameters must be finite
    save_checkpoint(model, str(tmp_path / 'a.pth'))
    assert verify_checksum(str(tmp_path / 'a.pth'))
    with torch.no_grad():
        model.net[0].bias[0] = math.inf
    with pytest.raises(InvalidLossError, match=r'net\.0\.bias'):
        save_checkpoint(model, str(tmp_path / 'b.pth'))
    assert not (tmp_path / 'b.pth').exists()


def test_a_finished_dreambooth_run_with_nan_weights_writes_no_pipeline(tmp_path):
    # Item 2: a finite loss whose gradient is NaN at the last iteration: the run "finishes"
    # (every loss finite), and the pipeline export is refused, as the same state as a checkpoint is.
    from hookloop import build_trainer
    from hookloop.dreambooth import ToySubjectSamples, pretrain_toy_model
    base = str(tmp_path / 'base')
    pretrain_toy_model(steps=2, hidden=16).save_pretrained(base)
    trainer = build_trainer('dreambooth_diffusion', default_args=dict(
        model=base, instance_prompt='a sks dog', instance_data=ToySubjectSamples(2),
        train_dataloader=dict(batch_size=2), optimizer=dict(type='Adam', lr=1e-3), max_iters=3,
        work_dir=str(tmp_path / 'work'), seed=0, device='cpu', log_config=dict(interval=1), checkpoint_config=None))
    weight = trainer.model.denoiser.net[0].weight
    weight.register_hook(lambda grad: grad * math.nan if trainer.iter == 2 else grad)
    with pytest.raises(InvalidLossError, match=r'not saving .*pipeline: the weights are not finite .*denoiser\.net\.0\.weight'):
        trainer.train()
    trainer.close()
    assert not torch.isfinite(weight).all()  # the state a checkpoint would refuse
    assert not os.path.exists(tmp_path / 'work' / 'pipeline') and leftovers(tmp_path / 'work') == []
    clean = build_trainer('dreambooth_diffusion', default_args=dict(
        model=base, instance_prompt='a sks dog', instance_data=ToySubjectSamples(2),
        train_dataloader=dict(batch_size=2), optimizer=dict(type='Adam', lr=1e-3), max_iters=1,
        work_dir=str(tmp_path / 'clean'), seed=0, device='cpu', log_config=dict(interval=1)))
    clean.train()
    clean.close()
    assert verify_checksum(str(tmp_path / 'clean' / 'pipeline' / 'tiny_diffusion.safetensors'))


def test_a_directory_export_to_a_url_uploads_each_file_with_its_sidecar(tmp_path):
    import uuid
    from hookloop.fileio import storage
    url = f'memory://hookloop-gate-{uuid.uuid4().hex}/pipeline'

    def write(directory):
        os.makedirs(os.path.join(directory, 'unet'))
        open(os.path.join(directory, 'unet', 'w.bin'), 'wb').write(b'w')

    try:
        assert gate.export_directory(url, write, {'w': torch.ones(1)}) == url
        assert storage.read_bytes(url + '/unet/w.bin') == b'w'
        assert verify_checksum(url + '/unet/w.bin')
        with pytest.raises(InvalidLossError):
            gate.export_directory(url, write, {'w': torch.tensor(math.nan)})
    finally:
        filesystem, path = storage.filesystem(url)
        filesystem.rm(path.rsplit('/', 1)[0], recursive=True)


def test_a_sparse_weight_in_a_safetensors_export_is_one_clear_line(tmp_path):
    pytest.importorskip('safetensors')
    from hookloop.checkpoint.format import safetensors_bytes
    state = {'w': torch.ones(2), 'adjacency': torch.eye(2).to_sparse()}
    with pytest.raises(CheckpointError, match=r"safetensors holds dense tensors only, and \['adjacency'\] are sparse"):
        gate.export_file(str(tmp_path / 'w.safetensors'), lambda f: f.write(safetensors_bytes(state)), state)
    assert os.listdir(tmp_path) == []
