"""DreamBooth on a tiny random Stable Diffusion pipeline: LoRA through peft, text-encoder
training, small checkpoints (only what trains) and exact resume after kill -9."""
import os
import time

import pytest
import torch

from conftest import train_and_close as train
from hookloop import CheckpointError, ConfigError, Hook, build_trainer
from hookloop.checkpoint.format import load_checkpoint, read_pointer
from hookloop.fileio.hashing import default_algorithm
from hookloop.registry import HOOKS

pytest.importorskip('diffusers')
pytest.importorskip('peft')

from hookloop.dreambooth.random_pipeline import save_random_pipeline  # noqa: E402


@HOOKS.register_module(force=True)
class SlowIterationsHook(Hook):
    """Sleeps after each iteration, so a test can kill a run between two checkpoints."""

    def __init__(self, seconds=0.1):
        self.seconds = seconds

    def after_train_iter(self, trainer):
        time.sleep(self.seconds)


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    return save_random_pipeline(str(tmp_path_factory.mktemp('sd')), resolution=16)


def subject_images(directory, count=2):
    from PIL import Image
    os.makedirs(directory, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        pixels = (torch.rand(20, 24, 3, generator=generator) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(os.path.join(directory, f'subject_{i}.png'))
    return str(directory)


def dreambooth(tmp_path, base, **overrides):
    args = dict(model=base, instance_data_dir=subject_images(tmp_path / 'subject'), instance_prompt='a sks dog',
                resolution=16, optimizer=dict(type='AdamW', lr=1e-2), max_iters=3, work_dir=str(tmp_path / 'work'),
                seed=0, device='cpu', log_config=dict(interval=1))
    args.update(overrides)
    return build_trainer('dreambooth_diffusion', default_args=args)


def image(pipe, prompt='a sks dog'):
    pipe.set_progress_bar_config(disable=True)
    return pipe(prompt, num_inference_steps=2, height=16, width=16, output_type='np',
                generator=torch.Generator().manual_seed(0)).images


def test_lora_trains_only_adapters_and_load_lora_weights_reproduces_the_result(tmp_path, base):
    from diffusers import StableDiffusionPipeline
    trainer = dreambooth(tmp_path, base, lora=dict(rank=4, alpha=8))
    model = trainer.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all('.lora_' in n and n.startswith('unet.') for n in trainable)
    targets = {n.split('.lora_')[0].rsplit('.', 1)[-1] for n in trainable}
    assert targets == {'to_q', 'to_k', 'to_v', '0'}  # to_out.0
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group['params']}
    assert optimized == {id(p) for n, p in model.named_parameters() if n in trainable}
    train(trainer)
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before if '.lora_' not in k)  # base bitwise unchanged
    assert any(not torch.equal(after[k], before[k]) for k in before if '.lora_B' in k)

    saved = tmp_path / 'work' / 'pipeline'
    assert sorted(os.listdir(saved)) == ['pytorch_lora_weights.safetensors', 'pytorch_lora_weights.safetensors.' + default_algorithm()]
    plain = StableDiffusionPipeline.from_pretrained(base)
    base_image = image(plain)
    plain.load_lora_weights(str(saved))
    adapter = next(iter(plain.unet.peft_config.values()))
    assert (adapter.r, adapter.lora_alpha) == (4, 8)  # the alpha survives the round trip
    loaded_image = image(plain)
    assert abs(loaded_image - base_image).max() > 1e-3
    torch.testing.assert_close(torch.from_numpy(loaded_image), torch.from_numpy(image(model.pipeline())),
                               rtol=0, atol=1e-5)


def test_lora_on_the_text_encoder_too(tmp_path, base):
    from diffusers import StableDiffusionPipeline
    from safetensors.torch import load_file
    trainer = train(dreambooth(tmp_path, base, lora=dict(rank=2, alpha=2, text_encoder=True)))
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any(n.startswith('text_encoder.') for n in trainable)
    assert all('.lora_' in n for n in trainable)
    weights = load_file(str(tmp_path / 'work' / 'pipeline' / 'pytorch_lora_weights.safetensors'))
    assert any(k.startswith('text_encoder.') for k in weights) and any(k.startswith('unet.') for k in weights)
    pipe = StableDiffusionPipeline.from_pretrained(base)
    pipe.load_lora_weights(str(tmp_path / 'work' / 'pipeline'))
    assert getattr(pipe.text_encoder, 'peft_config', None)


def test_train_text_encoder_changes_it_with_its_own_lr_and_saves_it(tmp_path, base):
    from diffusers import StableDiffusionPipeline
    trainer = dreambooth(tmp_path, base, train_text_encoder=True, text_encoder_lr=1e-3)
    text_before = {k: v.clone() for k, v in trainer.model.text_encoder.state_dict().items()}
    lrs = sorted(group['lr'] for group in trainer.optimizer.param_groups)
    assert lrs == [1e-3, 1e-2]
    train(trainer)
    text_after = trainer.model.text_encoder.state_dict()
    assert any(not torch.equal(text_after[k], text_before[k]) for k in text_before)
    saved = StableDiffusionPipeline.from_pretrained(str(tmp_path / 'work' / 'pipeline')).text_encoder.state_dict()
    assert all(torch.equal(saved[k], text_after[k]) for k in text_after if k in saved)


def checkpoint_bytes_and_budget(trainer, path):
    checkpoint = load_checkpoint(path)
    trained = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)
    optimizer = sum(v.numel() * v.element_size() for state in trainer.optimizer.state.values()
                    for v in state.values() if isinstance(v, torch.Tensor))
    return os.path.getsize(path), trained + optimizer, checkpoint


# A checkpoint also pays about 0.4 KB per tensor and 16 KB of RNG state: on this tiny
# pipeline rank 4 gives 16 KB adapters, where that dominates; rank 16 shows the proportion.
@pytest.mark.parametrize('lora', [None, dict(rank=16, alpha=16)], ids=['unet', 'lora'])
def test_checkpoints_hold_only_what_trains(tmp_path, base, lora):
    trainer = train(dreambooth(tmp_path, base, lora=lora, max_iters=2,
                               checkpoint_config=dict(interval=2, by_epoch=False)))
    size, budget, checkpoint = checkpoint_bytes_and_budget(trainer, read_pointer(str(tmp_path / 'work')))
    assert size <= 1.25 * budget, (size, budget)
    saved = set(checkpoint['state_dict'])
    assert saved == {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert not any(k.startswith(('vae.', 'text_encoder.')) for k in saved)
    assert checkpoint['meta']['frozen']['saved'] is False


def test_resume_rebuilds_frozen_parts_and_refuses_a_different_base(tmp_path, base):
    args = dict(lora=dict(rank=4, alpha=4), max_iters=4, checkpoint_config=dict(interval=2, by_epoch=False))
    reference = train(dreambooth(tmp_path / 'ref', base, **args))
    first = train(dreambooth(tmp_path / 'run', base, **{**args, 'max_iters': 2}))
    middle = read_pointer(first.work_dir)
    resumed = train(dreambooth(tmp_path / 'run', base, resume_from=middle, **args))
    final, expected = resumed.model.state_dict(), reference.model.state_dict()
    assert all(torch.equal(final[k], expected[k]) for k in expected)

    other = save_random_pipeline(str(tmp_path / 'other_sd'), resolution=16, seed=1)
    with pytest.raises(CheckpointError, match='different frozen weights'):
        train(dreambooth(tmp_path / 'other', other, resume_from=middle, **args))


LORA_CONFIG = '''trainer = 'dreambooth_diffusion'
custom_imports = ['test_dreambooth_lora']
model = dict(type='DiffusersDreamBooth', pretrained_model_name_or_path={base!r}, num_inference_steps=2)
instance_data_dir = {subject!r}
instance_prompt = 'a sks dog'
with_prior_preservation = True
class_prompt = 'a dog'
num_class_images = 2
resolution = 16
lora = dict(rank=4, alpha=8)
center_crop = False
random_flip = True
optimizer = dict(type='AdamW', lr=1e-2)
max_iters = 8
checkpoint_config = dict(interval=2, by_epoch=False)
custom_hooks = [dict(type='SlowIterationsHook', seconds={delay})]
log_config = dict(interval=1)
seed = 0
device = 'cpu'
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lora_kill_9_then_resume_auto_is_bitwise_exact(tmp_path, base):
    from resume_helpers import kill_at_first_checkpoint, kill_leftovers, launch
    from hookloop.cli import build_from_config
    subject = subject_images(tmp_path / 'subject')
    config = tmp_path / 'lora.py'
    config.write_text(LORA_CONFIG.format(base=base, subject=subject, delay=0.0))
    reference = build_from_config(str(config), work_dir=str(tmp_path / 'reference'))
    train(reference)
    config.write_text(LORA_CONFIG.format(base=base, subject=subject, delay=0.3))
    work_dir = tmp_path / 'run'
    try:
        process = launch(str(config), work_dir)
        killed_at = kill_at_first_checkpoint(process, work_dir, timeout=120)
        assert killed_at < 8
        config.write_text(LORA_CONFIG.format(base=base, subject=subject, delay=0.0))
        process = launch(str(config), work_dir)
        output = process.communicate(timeout=180)[0].decode()
        assert process.returncode == 0, output[-3000:]
    finally:
        kill_leftovers()
    final = load_checkpoint(read_pointer(str(work_dir)))
    expected = load_checkpoint(read_pointer(str(tmp_path / 'reference')))
    assert final['meta']['iter'] == 8 and set(final['state_dict']) == set(expected['state_dict'])
    for key, value in expected['state_dict'].items():
        assert torch.equal(final['state_dict'][key], value), key
    from safetensors.torch import load_file
    a = load_file(str(work_dir / 'pipeline' / 'pytorch_lora_weights.safetensors'))
    b = load_file(str(tmp_path / 'reference' / 'pipeline' / 'pytorch_lora_weights.safetensors'))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lora_options_are_checked(tmp_path, base):
    with pytest.raises(ConfigError, match="lora got unknown keys \\['ranks'\\]"):
        dreambooth(tmp_path, base, lora=dict(ranks=4))


@pytest.mark.slow
def test_the_lora_example_config_trains_on_a_random_pipeline(tmp_path, base):
    from hookloop.cli import build_from_config
    config = os.path.join(os.path.dirname(__file__), '..', 'configs', 'dreambooth_lora.py')
    subject = subject_images(tmp_path / 'subject')
    trainer = build_from_config(config, [
        f'model={base!r}', f'instance_data_dir={subject!r}', 'resolution=16', 'num_class_images=1', 'max_iters=2',
        'optimizer_config.precision="bf16"', 'train_dataloader.num_workers=0', 'validation.every_n_iters=2',
        'validation.num_inference_steps=2', 'checkpoint_config.interval=2', 'lr_config.warmup_iters=1'],
        work_dir=str(tmp_path / 'work'))
    train(trainer)
    assert sorted(os.listdir(tmp_path / 'work' / 'pipeline')) == ['pytorch_lora_weights.safetensors', 'pytorch_lora_weights.safetensors.' + default_algorithm()]
    assert len(os.listdir(tmp_path / 'work' / 'validation' / 'iter_2')) == 2
    assert not any(k.startswith('vae.') for k in load_checkpoint(read_pointer(str(tmp_path / 'work')))['state_dict'])
