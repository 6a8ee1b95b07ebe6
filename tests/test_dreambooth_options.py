"""DreamBooth's inputs and training options as diffusers' scripts have them: EXIF
orientation, crops and flips, min-SNR weighting, offset noise, precision casts, precomputed
prompt embeddings, 8-bit Adam, LR scaling, gradient checkpointing, class images per rank."""
import os

import pytest
import torch

from conftest import train_and_close as train
from dreambooth_helpers import dreambooth
from hookloop import ConfigError, build_trainer
from hookloop.dreambooth.dataset import image_to_tensor

pytest.importorskip('diffusers')

from hookloop.dreambooth.random_pipeline import save_random_pipeline  # noqa: E402


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    return save_random_pipeline(str(tmp_path_factory.mktemp('sd')), resolution=16)


def asymmetric_image(width=24, height=16):
    from PIL import Image
    pixels = torch.arange(height * width * 3, dtype=torch.int64).remainder(251).to(torch.uint8)
    return Image.fromarray(pixels.view(height, width, 3).numpy())


# -- inputs ----------------------------------------------------------------------------------
def test_exif_orientation_6_yields_the_rotated_sample(tmp_path):
    from PIL import Image
    image = asymmetric_image()
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the camera was turned; viewers rotate 90 degrees clockwise
    image.save(tmp_path / 'phone.jpg', exif=exif.tobytes(), quality=100, subsampling=0)
    with Image.open(tmp_path / 'phone.jpg') as stored:
        sample = image_to_tensor(stored, None)
        raw = torch.from_numpy(__import__('numpy').asarray(stored.convert('RGB'))).permute(2, 0, 1).float()
    assert sample.shape == (3, 24, 16)  # portrait, as the photo is shown
    expected = torch.rot90(raw / 127.5 - 1.0, k=-1, dims=(1, 2))  # 90 degrees clockwise
    assert torch.equal(sample, expected)


def test_center_crop_random_crop_and_flip():
    image = asymmetric_image(24, 16)
    centre = image_to_tensor(image, 16, center_crop=True)
    assert centre.shape == (3, 16, 16)
    full = image_to_tensor(image, None)
    assert torch.equal(centre, full[:, :, 4:20])
    torch.manual_seed(0)
    crops = [image_to_tensor(image, 16, center_crop=False) for _ in range(8)]
    assert any(not torch.equal(c, centre) for c in crops)
    assert all(any(torch.equal(c, full[:, :, left:left + 16]) for left in range(9)) for c in crops)
    torch.manual_seed(0)
    assert all(torch.equal(a, image_to_tensor(image, 16, center_crop=False)) for a in crops)  # global RNG
    flips = [image_to_tensor(image, 16, center_crop=True, random_flip=True) for _ in range(8)]
    assert {torch.equal(f, centre.flip(-1)) for f in flips} == {True, False}
    assert all(torch.equal(f, centre) or torch.equal(f, centre.flip(-1)) for f in flips)


def test_grey_and_rgba_images_become_rgb():
    from PIL import Image
    assert image_to_tensor(Image.new('L', (8, 8), 200), 8).shape == (3, 8, 8)
    assert image_to_tensor(Image.new('RGBA', (8, 8), (10, 20, 30, 0)), 8)[:, 0, 0].tolist() == \
        pytest.approx([10 / 127.5 - 1, 20 / 127.5 - 1, 30 / 127.5 - 1])


def test_tokenizer_max_length_is_used(tmp_path, base):
    model = dreambooth(tmp_path, base, tokenizer_max_length=8).model
    assert model.encode_prompts(['a sks dog'], torch.device('cpu')).shape[1] == 8


# -- min-SNR ---------------------------------------------------------------------------------
@pytest.mark.parametrize('prediction_type', ['epsilon', 'v_prediction'])
def test_min_snr_weights_follow_the_paper(prediction_type):
    from diffusers import DDPMScheduler
    from hookloop.dreambooth.diffusers_backend import min_snr_weights
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_schedule='scaled_linear', beta_start=0.00085,
                              beta_end=0.012)
    timesteps = torch.tensor([0, 10, 250, 500, 999])
    gamma = 5.0
    weights = min_snr_weights(scheduler.alphas_cumprod, timesteps, gamma, prediction_type)
    # Hang et al. 2023: x_t = alpha_t x_0 + sigma_t eps, SNR(t) = alpha_t^2 / sigma_t^2; the
    # weight of the epsilon loss is min(SNR, gamma) / SNR, of the v loss min(SNR, gamma) / (SNR + 1).
    for t, w in zip(timesteps.tolist(), weights.tolist()):
        abar = float(scheduler.alphas_cumprod[t])
        alpha, sigma = abar ** 0.5, (1 - abar) ** 0.5
        snr = alpha ** 2 / sigma ** 2
        expected = min(snr, gamma) / (snr if prediction_type == 'epsilon' else snr + 1)
        assert w == pytest.approx(expected, rel=1e-5)


def test_snr_gamma_weights_the_instance_loss(tmp_path, base):
    from hookloop.dreambooth.loss import PriorPreservationLoss
    model = dreambooth(tmp_path, base, snr_gamma=5.0).model
    pixels = torch.rand(2, 3, 16, 16) * 2 - 1
    torch.manual_seed(3)
    outputs = model(pixels, ['a sks dog'] * 2)
    torch.manual_seed(3)
    torch.randn(2, 4, 8, 8)  # the latents' sample, then the noise: the same draws as forward
    torch.randn(2, 4, 8, 8)
    timesteps = torch.randint(0, 1000, (2,))
    abar = model.noise_scheduler.alphas_cumprod[timesteps]
    snr = abar / (1 - abar)
    weight = torch.minimum(snr, torch.tensor(5.0)) / snr
    error = ((outputs['model_pred'].float() - outputs['target'].float()) ** 2).mean(dim=(1, 2, 3))
    loss = PriorPreservationLoss()(outputs, None)['loss']
    torch.testing.assert_close(loss, (error * weight).mean())


def test_noise_offset_shifts_each_channel(tmp_path, base):
    plain = dreambooth(tmp_path / 'a', base).model
    offset = dreambooth(tmp_path / 'b', base, noise_offset=0.1).model
    pixels = torch.rand(2, 3, 16, 16) * 2 - 1
    torch.manual_seed(1)
    target = plain(pixels, ['a sks dog'] * 2)['target']
    torch.manual_seed(1)
    shifted = offset(pixels, ['a sks dog'] * 2)['target']
    difference = shifted - target
    assert difference.abs().max() > 0
    torch.testing.assert_close(difference, difference[:, :, :1, :1].expand_as(difference))


# -- memory and optimizer options ------------------------------------------------------------
def test_bf16_casts_the_frozen_parts_and_keeps_trainable_float32(tmp_path, base):
    trainer = train(dreambooth(tmp_path, base, lora=dict(rank=4), optimizer_config=dict(precision='bf16')))
    model = trainer.model
    assert {p.dtype for p in model.vae.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.text_encoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.unet.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in model.unet.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert torch.isfinite(trainer.outputs['loss'])


def test_pre_computed_embeddings_free_the_text_encoder_and_train_the_same(tmp_path, base):
    from diffusers import StableDiffusionPipeline
    cached = train(dreambooth(tmp_path / 'cached', base))
    freed = dreambooth(tmp_path / 'freed', base, pre_compute_text_embeddings=True)
    assert freed.model.text_encoder is None
    train(freed)
    a, b = cached.model.unet.state_dict(), freed.model.unet.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert StableDiffusionPipeline.from_pretrained(str(tmp_path / 'freed' / 'pipeline')).text_encoder is not None


def test_use_8bit_adam_without_bitsandbytes_is_a_clear_error(tmp_path, base):
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match='use_8bit_adam=True needs bitsandbytes'):
            dreambooth(tmp_path, base, use_8bit_adam=True)
    else:
        assert type(dreambooth(tmp_path, base, use_8bit_adam=True).optimizer).__name__ == 'AdamW8bit'


def test_text_encoder_lr_without_a_trained_text_encoder_is_refused(tmp_path, base):
    with pytest.raises(ConfigError, match='text_encoder_lr is set but the text encoder does not train'):
        dreambooth(tmp_path, base, text_encoder_lr=1e-4)


def test_scale_lr_and_default_clipping(tmp_path, base):
    trainer = dreambooth(tmp_path, base, scale_lr=True, train_dataloader=dict(batch_size=2),
                         optimizer_config=dict(cumulative_iters=2))
    assert trainer.optimizer.param_groups[0]['lr'] == pytest.approx(1e-2 * 2 * 2)
    trainer.resolve_hooks()
    hook = next(h for h in trainer.hooks if type(h).__name__ == 'OptimizerHook')
    assert hook.grad_clip['max_norm'] == 1.0


def test_gradient_checkpointing_trains_to_the_same_weights(tmp_path, base):
    # SGD: Adam's normalisation would blow rounding-level gradient differences (the
    # recomputed forward sums in another order) up to a full step on near-zero gradients.
    sgd = dict(type='SGD', lr=0.1)
    plain = train(dreambooth(tmp_path / 'a', base, train_text_encoder=True, optimizer=sgd))
    checkpointed = dreambooth(tmp_path / 'b', base, train_text_encoder=True, gradient_checkpointing=True,
                              optimizer=sgd)
    assert checkpointed.model.unet.is_gradient_checkpointing
    assert checkpointed.model.text_encoder.is_gradient_checkpointing
    train(checkpointed)
    a, b = plain.model.state_dict(), checkpointed.model.state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


def test_options_need_the_diffusers_back_end(tmp_path):
    from hookloop.dreambooth import TinyDiffusion
    with pytest.raises(ConfigError, match="\\['lora'\\] configure the diffusers back-end"):
        build_trainer('dreambooth_diffusion', default_args=dict(
            model=TinyDiffusion(), instance_data=torch.zeros(1, 1, 8, 8), instance_prompt='a sks dog',
            lora=dict(rank=4), optimizer=dict(type='Adam', lr=1e-3), max_iters=1, work_dir=str(tmp_path),
            device='cpu'))
    with pytest.raises(ConfigError, match="\\['snr_gamma'\\] need the diffusers back-end .* not 'TinyDiffusion'"):
        build_trainer('dreambooth_diffusion', default_args=dict(
            model=dict(type='TinyDiffusion'), instance_data=torch.zeros(1, 1, 8, 8), instance_prompt='a sks dog',
            snr_gamma=5.0, optimizer=dict(type='Adam', lr=1e-3), max_iters=1, work_dir=str(tmp_path),
            device='cpu'))


# -- class images across ranks ---------------------------------------------------------------
def test_class_images_are_split_across_ranks_and_equal_a_single_rank_run(tmp_path):
    from hookloop.dreambooth import ToySubjectSamples, pretrain_toy_model
    model = pretrain_toy_model(steps=20, hidden=16, seed=0)

    def trainer(work_dir):
        return build_trainer('dreambooth_diffusion', default_args=dict(
            model=model, instance_data=ToySubjectSamples(2), instance_prompt='a sks dog',
            with_prior_preservation=True, class_prompt='a dog', num_class_images=5, sample_batch_size=2,
            optimizer=dict(type='Adam', lr=1e-3), max_iters=1, work_dir=str(work_dir), seed=0, device='cpu'))

    from safetensors.torch import load_file
    single = trainer(tmp_path / 'single')
    single.generate_class_images()
    written = {}
    for rank in (0, 1):  # each of two ranks sees the same (empty) directory when it starts
        split = trainer(tmp_path / f'rank{rank}')
        split.rank, split.world_size = rank, 2
        os.makedirs(tmp_path / f'rank{rank}' / 'class_samples', exist_ok=True)  # rank 0 makes it, then a barrier
        with pytest.raises(ConfigError, match='holds . samples, 5 are needed'):  # the other share is missing
            split.generate_class_images()
        written[rank] = sorted(os.listdir(tmp_path / f'rank{rank}' / 'class_samples'))
        split.close()
    assert written[0] == ['class_00000.safetensors', 'class_00001.safetensors', 'class_00004.safetensors']
    assert written[1] == ['class_00002.safetensors', 'class_00003.safetensors']  # batch 1 of batches 0, 1, 2
    for rank, names in written.items():
        for name in names:
            assert torch.equal(load_file(str(tmp_path / 'single' / 'class_samples' / name))['sample'],
                               load_file(str(tmp_path / f'rank{rank}' / 'class_samples' / name))['sample'])
    single.close()
