"""Issue 27: a diffusers user's DreamBooth flags mean what they mean in diffusers'
``train_dreambooth_lora.py`` / ``train_dreambooth.py``, and images are prepared as
torchvision prepares them there (Resize / CenterCrop / RandomCrop). The unpinned
end-to-end equivalence is tests/test_dreambooth_equivalence.py."""
import glob
import os
import sys

import pytest
import torch

from conftest import train_and_close as train
from dreambooth_helpers import dreambooth
from hookloop import ConfigError, build_trainer
from hookloop.data.resumable import ResumableBatchSampler
from hookloop.dreambooth.dataset import (INTERPOLATION_MODES, center_crop_box, image_to_tensor, random_crop_box,
                                         resized_size)

pytest.importorskip('diffusers')
pytest.importorskip('peft')

from hookloop.dreambooth.random_pipeline import save_random_pipeline  # noqa: E402


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    return save_random_pipeline(str(tmp_path_factory.mktemp('sd')), resolution=16)


def noise_image(width, height, seed=0):
    from PIL import Image
    pixels = (torch.rand(height, width, 3, generator=torch.Generator().manual_seed(seed)) * 255).to(torch.uint8)
    return Image.fromarray(pixels.numpy())


def as_tensor(image):
    import numpy as np
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).float() / 127.5 - 1


def subject_dir(directory, sizes=((23, 20),)):
    os.makedirs(directory, exist_ok=True)
    for i, (w, h) in enumerate(sizes):
        noise_image(w, h, i).save(os.path.join(directory, f'subject_{i}.png'))
    return str(directory)


# -- 1: train_text_encoder with lora is text-encoder LoRA ---------------------------------------
def test_train_text_encoder_with_lora_trains_text_encoder_adapters_and_says_so(tmp_path, base):
    trainer = dreambooth(tmp_path / 'work', base, lora=dict(rank=2), train_text_encoder=True)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert all('.lora_' in n for n in trainable)  # no full text-encoder fine-tuning
    assert any(n.startswith('text_encoder.') for n in trainable) and any(n.startswith('unet.') for n in trainable)
    train(trainer)
    log = open(glob.glob(str(tmp_path / 'work' / '*.log'))[0], encoding='utf-8').read()
    assert 'dreambooth_diffusion trains: UNet LoRA adapters (rank 2, alpha 2) and text-encoder LoRA adapters' in log
    full = dreambooth(tmp_path / 'full', base, train_text_encoder=True)
    assert full.model.training_summary == 'the UNet and the whole text encoder (full fine-tuning)'
    assert all(p.requires_grad for p in full.model.text_encoder.parameters())


# -- 2: torchvision's sizes, offsets and interpolation modes ------------------------------------
def test_resize_truncates_the_long_side_as_torchvision():
    assert resized_size(1024, 768, 512) == (682, 512)  # 4:3 -> 682.67 -> 682, not 683
    assert resized_size(768, 1024, 512) == (512, 682)
    assert resized_size(1920, 1080, 512) == (910, 512)


def test_center_crop_rounds_the_offset_half_to_even():
    # 1920x1200 at 512: 819x512, offset (819 - 512) / 2 = 153.5 -> 154 (floor: 153)
    assert resized_size(1920, 1200, 512) == (819, 512)
    assert center_crop_box(819, 512, 512) == (154, 0, 666, 512)
    assert center_crop_box(513, 512, 512) == (0, 0, 512, 512)  # 0.5 -> 0 (half to even)
    assert center_crop_box(515, 512, 512) == (2, 0, 514, 512)  # 1.5 -> 2


def test_random_crop_draws_nothing_when_the_image_has_the_crop_size():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    assert random_crop_box(16, 16, 16) == (0, 0, 16, 16)
    image_to_tensor(noise_image(32, 32), 16, center_crop=False)  # resized to 16x16: no crop to draw
    assert torch.equal(torch.get_rng_state(), before)
    image_to_tensor(noise_image(32, 34), 16, center_crop=False)  # 16x17: top and left drawn
    assert not torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize('mode', sorted(INTERPOLATION_MODES))
def test_each_interpolation_mode_resizes_with_its_pil_filter(mode):
    from PIL import Image
    filters = dict(nearest=Image.NEAREST, nearest_exact=Image.NEAREST, bilinear=Image.BILINEAR,
                   bicubic=Image.BICUBIC, box=Image.BOX, hamming=Image.HAMMING, lanczos=Image.LANCZOS)
    image = noise_image(48, 36)  # 4:3 -> 21x16 at 16 (21.33 truncated), centre offset 2.5 -> 2
    expected = as_tensor(image.resize((21, 16), filters[mode]).crop((2, 0, 18, 16)))
    assert torch.equal(image_to_tensor(image, 16, center_crop=True, interpolation=mode), expected)


def test_an_image_at_the_size_is_not_resampled():
    image = noise_image(16, 20)
    assert torch.equal(image_to_tensor(image, 16, center_crop=True, interpolation='lanczos'),
                       as_tensor(image.crop((0, 2, 16, 18))))


def test_lanczos_by_default_for_lora_bilinear_for_full_fine_tuning(tmp_path, base):
    subject = subject_dir(tmp_path / 'subject')
    common = dict(instance_data=None, instance_data_dir=subject, resolution=16)
    lora = dreambooth(tmp_path / 'lora', base, lora=dict(rank=2), **common)
    full = dreambooth(tmp_path / 'full', base, **common)
    assert (lora.dreambooth_dataset.interpolation, full.dreambooth_dataset.interpolation) == ('lanczos', 'bilinear')
    chosen = dreambooth(tmp_path / 'box', base, lora=dict(rank=2), image_interpolation_mode='box', **common)
    assert chosen.dreambooth_dataset.interpolation == 'box'
    with pytest.raises(ConfigError, match='image_interpolation_mode must be one of nearest, nearest_exact'):
        dreambooth(tmp_path / 'bad', base, image_interpolation_mode='cubic', **common)


# -- 3: RNG use as the reference script (the end-to-end check is the equivalence test) -------------
def test_sampler_draws_like_a_dataloader_per_fresh_epoch_and_none_on_re_entry():
    def draws(sampler, start_batch):
        sampler.set_epoch(1, start_batch)
        torch.manual_seed(5)
        list(sampler)
        return torch.get_rng_state()

    torch.manual_seed(5)
    reference = torch.utils.data.DataLoader(list(range(4)), batch_size=2, shuffle=True)
    list(reference)  # base seed + RandomSampler seed, both from the global RNG
    after_loader = torch.get_rng_state()
    torch.manual_seed(5)
    untouched = torch.get_rng_state()
    sampler = ResumableBatchSampler(4, 2, shuffle=True)
    assert torch.equal(draws(sampler, 0), untouched)  # the default: the global RNG is not used
    sampler.global_rng_draws = 2
    assert torch.equal(draws(sampler, 0), after_loader)
    assert torch.equal(draws(sampler, 1), untouched)  # a re-entered epoch drew them before the checkpoint


def test_the_trainer_does_not_reseed_after_lora_init_and_its_sampler_draws(tmp_path, base):
    torch.manual_seed(0)
    from hookloop.dreambooth import DiffusersDreamBooth
    DiffusersDreamBooth(base, lora=dict(rank=2))
    after_lora = torch.get_rng_state()
    trainer = dreambooth(tmp_path, base, lora=dict(rank=2))
    assert torch.equal(torch.get_rng_state(), after_lora)
    assert trainer.train_dataloader.batch_sampler.global_rng_draws == 2


@pytest.mark.parametrize('resume_at', [2, 3], ids=['epoch-boundary', 'mid-epoch'])
def test_resume_reenters_an_epoch_without_drawing_again(tmp_path, base, resume_at):
    from safetensors.torch import load_file
    subject = subject_dir(tmp_path / 'subject', sizes=((23, 20), (20, 26)))  # 2 batches per epoch
    args = dict(instance_data=None, instance_data_dir=subject, resolution=16, lora=dict(rank=2), max_iters=5)
    train(dreambooth(tmp_path / 'full', base, checkpoint_config=dict(interval=1, by_epoch=False), **args))
    checkpoint = str(tmp_path / 'full' / f'iter_{resume_at}.pth')
    train(dreambooth(tmp_path / 'resumed', base, resume_from=checkpoint, **args))
    a = load_file(str(tmp_path / 'full' / 'pipeline' / 'pytorch_lora_weights.safetensors'))
    b = load_file(str(tmp_path / 'resumed' / 'pipeline' / 'pytorch_lora_weights.safetensors'))
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- 4: the UNet's parameters first ------------------------------------------------------------
def test_unet_parameters_come_first_in_the_optimizer_and_the_clip_norm(tmp_path, base):
    trainer = dreambooth(tmp_path, base, lora=dict(rank=2, text_encoder=True))
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    order = [names[id(p)].split('.')[0] for g in trainer.optimizer.param_groups for p in g['params']]
    assert order == sorted(order, key=lambda part: part != 'unet') and order[0] == 'unet' and 'text_encoder' in order


# -- 5: custom_imports before the model; a DiffusersDreamBooth subclass takes lora= -------------
def test_a_backend_registered_by_custom_imports_and_a_subclass_take_lora(tmp_path, base, monkeypatch):
    (tmp_path / 'my_backend_i27.py').write_text(
        'from hookloop.dreambooth import DiffusersDreamBooth\n'
        'from hookloop.registry import MODELS\n\n\n'
        '@MODELS.register_module(force=True)\n'
        'class MyDreamBoothI27(DiffusersDreamBooth):\n'
        '    pass\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'my_backend_i27', raising=False)
    trainer = dreambooth(tmp_path / 'work', base, custom_imports=['my_backend_i27'], lora=dict(rank=2),
                         model=dict(type='MyDreamBoothI27', pretrained_model_name_or_path=base))
    assert type(trainer.model).__name__ == 'MyDreamBoothI27' and trainer.model.lora['rank'] == 2


# -- 6: a checkpoint every 500 iterations by default; warm-up from 0 --------------------------------
def checkpoint_hook(trainer):
    return next(h for h in trainer.hooks if type(h).__name__ == 'CheckpointHook')


def test_a_checkpoint_every_500_iterations_by_default_for_every_backend(tmp_path, base):
    from hookloop.dreambooth import ToySubjectSamples  # noqa: F401  (registers the toy data)
    hook = checkpoint_hook(dreambooth(tmp_path / 'sd', base))
    assert (hook.interval, hook.by_epoch, hook.save_frozen) == (500, False, False)
    tiny = build_trainer('dreambooth_diffusion', default_args=dict(
        model=dict(type='TinyDiffusion'), instance_data=torch.zeros(2, 64), instance_prompt='a sks dog',
        optimizer=dict(type='AdamW', lr=1e-3), max_iters=1, work_dir=str(tmp_path / 'tiny'), device='cpu'))
    assert (checkpoint_hook(tiny).interval, checkpoint_hook(tiny).by_epoch) == (500, False)
    none = dreambooth(tmp_path / 'none', base, checkpoint_config=None)
    assert not any(type(h).__name__ == 'CheckpointHook' for h in none.hooks)


def test_linear_warmup_from_zero_is_diffusers_constant_with_warmup(tmp_path):
    from diffusers.optimization import get_scheduler
    from hookloop import Hook, Trainer
    seen = []

    class Record(Hook):
        def before_train_iter(self, trainer):
            seen.append(trainer.optimizer.param_groups[0]['lr'])

    model = torch.nn.Linear(2, 1)
    trainer = Trainer(model, optimizer=dict(type='AdamW', lr=0.1), max_iters=6, device='cpu',
                      train_dataloader=dict(dataset=[torch.zeros(2)] * 2, batch_size=1),
                      loss_fn=lambda out, batch: {'loss': out.float().pow(2).mean()}, work_dir=str(tmp_path),
                      lr_config=dict(policy='Fixed', warmup='linear', warmup_iters=4, warmup_ratio=0.0,
                                     by_epoch=False), custom_hooks=[Record()])
    train(trainer)
    reference_opt = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    schedule = get_scheduler('constant_with_warmup', reference_opt, num_warmup_steps=4)
    expected = []
    for _ in range(6):
        expected.append(reference_opt.param_groups[0]['lr'])
        reference_opt.step()
        schedule.step()
    assert seen == pytest.approx(expected, rel=1e-12, abs=0) and seen[0] == 0.0
    with pytest.raises(ConfigError, match='warmup_ratio'):
        Trainer(model, optimizer=dict(type='SGD', lr=0.1), lr_config=dict(policy='Fixed', warmup='exp',
                warmup_iters=4, warmup_ratio=0.0), work_dir=str(tmp_path / 'exp'))


# -- 7: the weights files follow the umask ---------------------------------------------------------
def test_lora_and_pipeline_files_get_the_umask_mode(tmp_path, base):
    old = os.umask(0o022)
    try:
        for name, extra in (('lora', dict(lora=dict(rank=2))), ('full', {})):
            train(dreambooth(tmp_path / name, base, max_iters=1, checkpoint_config=None, **extra))
            files = glob.glob(str(tmp_path / name / 'pipeline' / '**' / '*.safetensors'), recursive=True)
            assert files and all(os.stat(f).st_mode & 0o777 == 0o644 for f in files), name
    finally:
        os.umask(old)


# -- 8: diffusers flag names work with their meaning or are refused with hookloop's spelling -------
def test_diffusers_checkpoint_flags_work_with_their_meaning(tmp_path, base):
    hook = checkpoint_hook(dreambooth(tmp_path, base, checkpointing_steps=3, checkpoints_total_limit=2))
    assert (hook.interval, hook.by_epoch, hook.max_keep_ckpts) == (3, False, 2)


def test_a_ported_command_line_builds_what_the_script_would(tmp_path, base):
    trainer = build_trainer('dreambooth_diffusion', default_args=dict(
        pretrained_model_name_or_path=base, instance_data=torch.zeros(1, 3, 16, 16), instance_prompt='a sks dog',
        learning_rate=1e-4, adam_beta1=0.8, adam_weight_decay=0.0, adam_epsilon=1e-6, max_train_steps=7,
        train_batch_size=2, dataloader_num_workers=0, output_dir=str(tmp_path / 'out'), mixed_precision='no',
        device='cpu', validation_prompt=None, push_to_hub=False))  # unset and switched-off flags are fine
    group = trainer.optimizer.param_groups[0]
    assert type(trainer.optimizer).__name__ == 'AdamW'
    assert (group['lr'], group['betas'], group['weight_decay'], group['eps']) == (1e-4, (0.8, 0.999), 0.0, 1e-6)
    assert trainer.max_iters == 7 and trainer.train_dataloader.batch_sampler.batch_size == 2
    assert os.path.abspath(trainer.work_dir) == str(tmp_path / 'out')
    with pytest.raises(ConfigError, match="--learning_rate=0.001 and optimizer.lr=0.01 disagree"):
        dreambooth(tmp_path, base, learning_rate=1e-3)  # the helper's optimizer has lr=1e-2
    dreambooth(tmp_path, base, learning_rate=1e-2)  # a helper variable used in optimizer: the same value


@pytest.mark.parametrize('flag, value, spelling', [
    ('lr_warmup_steps', 10, 'warmup_iters=N, warmup_ratio=0.0'),
    ('validation_epochs', 5, 'validation=dict(every_n_iters=N)'),
    ('report_to', 'wandb', 'log_config=dict(hooks='),
    ('lr_scheduler', 'cosine', 'lr_config=dict(policy=...)'),
    ('num_train_epochs', 2, 'max_epochs=N'),
    ('rank', 8, 'lora=dict(rank=N)'),
    ('push_to_hub', True, 'not supported'),
])
def test_other_diffusers_flags_are_errors_naming_the_hookloop_spelling(tmp_path, base, flag, value, spelling):
    with pytest.raises(ConfigError, match=f"diffusers' --{flag} ") as error:
        dreambooth(tmp_path, base, **{flag: value})
    assert spelling in str(error.value)
    assert not os.path.exists(tmp_path / 'checkpoints')
