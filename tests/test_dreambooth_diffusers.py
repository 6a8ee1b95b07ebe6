"""DreamBooth with the diffusers back-end on a tiny random Stable Diffusion pipeline
built from configs in code (no download)."""
import os

import pytest
import torch

from hookloop import ConfigError, build_trainer

pytest.importorskip('diffusers')
pytest.importorskip('transformers')

from hookloop.dreambooth.random_pipeline import save_random_pipeline  # noqa: E402


@pytest.fixture(scope='module')
def random_pipeline(tmp_path_factory):
    return save_random_pipeline(str(tmp_path_factory.mktemp('sd')), resolution=16)


def subject_images(directory, count=2):
    from PIL import Image
    os.makedirs(directory)
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        pixels = (torch.rand(20, 24, 3, generator=generator) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(os.path.join(directory, f'subject_{i}.png'))  # resized + cropped to 16
    return str(directory)


def test_random_pipeline_fine_tunes_and_saves_a_loadable_pipeline(tmp_path, random_pipeline):
    from diffusers import StableDiffusionPipeline
    from safetensors.torch import load_file
    trainer = build_trainer('dreambooth_diffusion', default_args=dict(
        model=dict(type='DiffusersDreamBooth', pretrained_model_name_or_path=random_pipeline, num_inference_steps=2),
        instance_data_dir=subject_images(tmp_path / 'subject'), instance_prompt='a photo of sks dog',
        with_prior_preservation=True, class_prompt='a photo of dog', num_class_images=2, resolution=16,
        train_dataloader=dict(batch_size=1), optimizer=dict(type='AdamW', lr=1e-3), max_iters=3,
        work_dir=str(tmp_path / 'work'), seed=0, device='cpu', log_config=dict(interval=1)))
    model = trainer.model
    frozen_before = {name: p.clone() for name, p in model.named_parameters() if not name.startswith('unet.')}
    unet_before = {name: p.clone() for name, p in model.unet.named_parameters()}
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group['params']}
    assert optimized == {id(p) for p in model.unet.parameters()}
    try:
        trainer.train()
    finally:
        trainer.close()
    assert len(os.listdir(tmp_path / 'work' / 'class_samples')) == 2
    assert torch.isfinite(trainer.outputs['loss']) and torch.isfinite(trainer.outputs['loss_prior'])
    assert all(torch.equal(p, frozen_before[name]) for name, p in model.named_parameters()
               if not name.startswith('unet.'))
    assert any(not torch.equal(p, unet_before[name]) for name, p in model.unet.named_parameters())

    saved = str(tmp_path / 'work' / 'pipeline')
    weights = load_file(os.path.join(saved, 'unet', 'diffusion_pytorch_model.safetensors'))
    assert all(torch.equal(weights[name], p) for name, p in model.unet.state_dict().items())
    pipe = StableDiffusionPipeline.from_pretrained(saved)
    pipe.set_progress_bar_config(disable=True)
    image = pipe('a photo of sks dog', num_inference_steps=2, height=16, width=16, output_type='np',
                 generator=torch.Generator().manual_seed(0)).images
    assert image.shape == (1, 16, 16, 3) and (image >= 0).all() and (image <= 1).all()


def test_resolution_must_be_a_multiple_of_the_vae_factor(tmp_path, random_pipeline):
    with pytest.raises(ConfigError, match='resolution 15 is not divisible by the VAE down-sampling factor 2'):
        build_trainer('dreambooth_diffusion', default_args=dict(
            model=random_pipeline, instance_data_dir=subject_images(tmp_path / 'subject'),
            instance_prompt='a photo of sks dog', resolution=15, optimizer=dict(type='AdamW', lr=1e-3),
            max_iters=1, work_dir=str(tmp_path / 'work'), device='cpu'))


def test_a_directory_without_the_pipeline_parts_is_refused(tmp_path):
    os.makedirs(tmp_path / 'not_sd')
    with pytest.raises(ConfigError, match='lacks the sub-folders'):
        build_trainer('dreambooth_diffusion', default_args=dict(
            model=dict(type='DiffusersDreamBooth', pretrained_model_name_or_path=str(tmp_path / 'not_sd')),
            instance_data=torch.zeros(1, 3, 16, 16), instance_prompt='a sks dog', max_iters=1,
            optimizer=dict(type='AdamW', lr=1e-3), work_dir=str(tmp_path / 'work'), device='cpu'))
