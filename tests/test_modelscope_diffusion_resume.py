"""Issue 37: ModelScope's DreamBooth and LoRA trainers killed with SIGKILL mid-run and started
again with ``resume_from='auto'`` end bitwise where an uninterrupted run ends (the checkpoints'
trained weights and the weights in ``output/``): what ModelScope's own trainers cannot do
(their ``train()`` restarts at iteration 0 with a new loader order)."""
import os
import subprocess
import sys

import pytest
import torch

from hookloop.checkpoint.format import load_checkpoint, read_pointer
from modelscope_sd_helpers import make_dataset_dir, make_model_dir, noise_png, one_thread, run_trainer  # noqa: F401
from resume_helpers import kill_at_first_checkpoint, kill_group

pytest.importorskip('diffusers')
pytest.importorskip('peft')

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


@pytest.fixture(scope='module')
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp('ms_resume')
    classes = root / 'class'
    classes.mkdir()
    for index in range(2):
        noise_png(str(classes / f'class_{index:05d}.png'), 80 + index, size=(18, 16))
    return make_model_dir(root / 'model'), make_dataset_dir(root / 'data', rows=3), str(classes)


def launch(name, model_dir, data_dir, work_dir, class_dir, delay):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]), OMP_NUM_THREADS='1')
    return subprocess.Popen([sys.executable, '-m', 'modelscope_sd_helpers', name, model_dir, data_dir, str(work_dir),
                             class_dir or '-', str(delay)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def output_weights(work_dir, lora):
    """The trained weights in output/: the LoRA file, or the pipeline's UNet."""
    name = 'pytorch_lora_weights.bin' if lora else os.path.join('unet', 'diffusion_pytorch_model.bin')
    return torch.load(os.path.join(work_dir, 'output', name), weights_only=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize('name', ['dreambooth-diffusion', 'lora-diffusion'])
def test_kill_9_then_resume_auto_is_bitwise_the_uninterrupted_run(tmp_path, inputs, name):
    model_dir, data_dir, class_dir = inputs
    class_dir = class_dir if name == 'dreambooth-diffusion' else None
    run_trainer(name, model_dir, data_dir, tmp_path / 'reference', class_dir)
    work_dir = tmp_path / 'run'
    process = launch(name, model_dir, data_dir, work_dir, class_dir, delay=1.0)
    try:
        killed_at = kill_at_first_checkpoint(process, work_dir, timeout=300)
        assert killed_at < 6
        process = launch(name, model_dir, data_dir, work_dir, class_dir, delay=0.0)
        output = process.communicate(timeout=300)[0].decode()
        assert process.returncode == 0, output[-3000:]
        assert f'iteration {killed_at} ' in output and 'resumed from' in output  # from where it was killed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        kill_group(process.pid)  # and what it started
    final = load_checkpoint(read_pointer(str(work_dir)))
    expected = load_checkpoint(read_pointer(str(tmp_path / 'reference')))
    assert final['meta']['iter'] == expected['meta']['iter'] == 6
    assert set(final['state_dict']) == set(expected['state_dict'])
    for key, value in expected['state_dict'].items():
        assert torch.equal(final['state_dict'][key], value), key
    lora = name == 'lora-diffusion'
    resumed, uninterrupted = output_weights(work_dir, lora), output_weights(tmp_path / 'reference', lora)
    assert resumed.keys() == uninterrupted.keys() and all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)
