"""``Trainer(compile=...)``: torch.compile on the CPU test model (inductor, which needs a C++
compiler): results match eager within float tolerance, checkpoints keep the plain keys, and
resume works (also from an eager checkpoint into a compiled run)."""
import os
import shutil

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import Regressor, regression_data
from conftest import train_and_close as train
from hookloop import Trainer
from hookloop.checkpoint.format import load_checkpoint
from hookloop.errors import ConfigError

CXX = os.environ.get('CXX') or shutil.which('g++') or shutil.which('c++') or shutil.which('clang++')
needs_compiler = pytest.mark.skipif(CXX is None, reason='torch.compile (inductor) on the CPU needs a C++ compiler '
                                                        '(g++, c++ or clang++), and none is installed')


def make_trainer(work_dir, compile=None, epochs=3, **kwargs):
    torch.manual_seed(0)
    loader = DataLoader(regression_data(), batch_size=8, shuffle=True)
    return Trainer(Regressor(), optimizer=dict(type='SGD', lr=0.05, momentum=0.9), train_dataloader=loader,
                   max_epochs=epochs, work_dir=work_dir, seed=0, device='cpu', log_config=dict(interval=100),
                   checkpoint_config=dict(interval=1), compile=compile, **kwargs)


def assert_close(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-5, atol=1e-6), f'{key}: {(a[key] - b[key]).abs().max()}'


@pytest.mark.parametrize('value, message', [
    ('yes', 'compile must be True, False or a dict'),
    (dict(mode='max-autotune', fulgraph=True), r"unknown option\(s\) \['fulgraph'\]"),
])
def test_bad_compile_options_are_refused_before_training(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        make_trainer(tmp_path, compile=value)


@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_compiler
def test_compiled_training_matches_eager_keeps_plain_keys_and_resumes(tmp_path):
    eager = train(make_trainer(tmp_path / 'eager'))
    compiled = train(make_trainer(tmp_path / 'compiled', compile=dict(fullgraph=True)))
    # nn.Module.compile routes the module's calls through torch.compile, in place
    assert getattr(compiled.model, '_compiled_call_impl', None) is not None
    assert type(compiled.model) is Regressor
    assert_close(compiled.model.state_dict(), eager.model.state_dict())
    checkpoint = load_checkpoint(str(tmp_path / 'compiled' / 'epoch_3.pth'))
    assert list(checkpoint['state_dict']) == list(Regressor().state_dict())  # no '_orig_mod.' prefix
    # Resume the compiled run from epoch 1, and an eager checkpoint into a compiled run.
    resumed = train(make_trainer(tmp_path / 'resumed', compile=True,
                                 resume_from=str(tmp_path / 'compiled' / 'epoch_1.pth')))
    assert_close(resumed.model.state_dict(), compiled.model.state_dict())
    from_eager = train(make_trainer(tmp_path / 'from_eager', compile=True,
                                    resume_from=str(tmp_path / 'eager' / 'epoch_1.pth')))
    assert_close(from_eager.model.state_dict(), eager.model.state_dict())
