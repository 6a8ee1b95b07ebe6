"""Unpinned equivalence with diffusers' ``examples/dreambooth/train_dreambooth_lora.py``: the
same seed and flags give the same per-step losses and the same LoRA file as a plain loop
written here from that script's documented steps (its argument defaults; nothing pinned,
no RNG state handed over), over 10 steps, prior preservation on/off x text-encoder LoRA on/off.

The plain loop: ``set_seed(seed)``; load tokenizer, scheduler, text encoder, VAE, UNet; freeze
them; LoRA (rank 4, alpha = rank, Gaussian init) on the UNet's ``to_k/to_q/to_v/to_out.0`` and,
with ``--train_text_encoder``, on CLIP's ``q/k/v/out_proj``; AdamW over the UNet's trainable
parameters then the text encoder's (betas 0.9/0.999, weight decay 1e-2, eps 1e-8); a
``DataLoader(shuffle=True, batch_size=1)`` over instance (and class) images prepared by
``Resize(resolution, lanczos)``, ``RandomCrop``, ``ToTensor``, ``Normalize([0.5], [0.5])``; per
step: VAE latents (sampled) x scaling factor, ``randn_like`` noise, ``randint`` timesteps,
``add_noise``, the prompt's CLIP hidden states, the UNet, float32 MSE (+ prior weight x prior
MSE), backward, ``clip_grad_norm_(UNet params [+ text encoder params], 1.0)``, step, zero_grad;
at the end the adapters in diffusers' LoRA format (``save_lora_weights``).
"""
import itertools
import math
import os
import random

import numpy as np
import pytest
import torch

from conftest import train_and_close as train
from hookloop import Hook, build_trainer
from hookloop.registry import HOOKS

pytest.importorskip('diffusers')
pytest.importorskip('peft')

from hookloop.dreambooth.random_pipeline import save_random_pipeline  # noqa: E402

RESOLUTION, STEPS, LR, SEED = 16, 10, 1e-2, 0


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    return save_random_pipeline(str(tmp_path_factory.mktemp('sd')), resolution=RESOLUTION)


def write_image(path, width, height, seed):
    from PIL import Image
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(height, width, 3, generator=generator) * 255).to(torch.uint8).numpy()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('data')
    write_image(str(root / 'instance' / 'dog.png'), 23, 20, 1)  # resized to 18x16, cropped at random
    write_image(str(root / 'class' / 'class_00000.png'), 32, 32, 2)  # resized to 16x16: RandomCrop draws nothing
    return str(root / 'instance'), str(root / 'class')


# -- the plain loop, from the script's documented steps ----------------------------------------
def _prepare(path, size):
    """Resize(size, lanczos): shorter side to size, longer truncated; RandomCrop(size):
    top then left from the global RNG unless the image already has the size; ToTensor and
    Normalize([0.5], [0.5])."""
    from PIL import Image, ImageOps
    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened).convert('RGB')
    w, h = image.size
    new = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    if new != (w, h):
        image = image.resize(new, Image.LANCZOS)
    w, h = image.size
    if (w, h) != (size, size):
        top = torch.randint(0, h - size + 1, size=(1,)).item()
        left = torch.randint(0, w - size + 1, size=(1,)).item()
        image = image.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(image, dtype=np.float32).copy()).permute(2, 0, 1) / 255.0
    return (x - 0.5) / 0.5


class _Images(torch.utils.data.Dataset):
    def __init__(self, instance_dir, class_dir, tokenizer, size):
        self.instance = sorted(os.path.join(instance_dir, n) for n in os.listdir(instance_dir))
        self.classes = sorted(os.path.join(class_dir, n) for n in os.listdir(class_dir)) if class_dir else []
        self.tokenizer, self.size = tokenizer, size

    def ids(self, prompt):
        return self.tokenizer(prompt, truncation=True, padding='max_length',
                              max_length=self.tokenizer.model_max_length, return_tensors='pt').input_ids

    def __len__(self):
        return max(len(self.instance), len(self.classes))

    def __getitem__(self, index):
        item = {'pixels': _prepare(self.instance[index % len(self.instance)], self.size),
                'ids': self.ids('a sks dog')}
        if self.classes:
            item['class_pixels'] = _prepare(self.classes[index % len(self.classes)], self.size)
            item['class_ids'] = self.ids('a dog')
        return item


def _collate(items):
    pixels = [i['pixels'] for i in items] + [i['class_pixels'] for i in items if 'class_pixels' in i]
    ids = [i['ids'] for i in items] + [i['class_ids'] for i in items if 'class_ids' in i]
    return torch.stack(pixels).float(), torch.cat(ids)


def plain_lora_run(base, instance_dir, class_dir, text_lora, out_dir):
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig, inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict
    from transformers import CLIPTextModel, CLIPTokenizer
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    tokenizer = CLIPTokenizer.from_pretrained(base, subfolder='tokenizer')
    scheduler = DDPMScheduler.from_pretrained(base, subfolder='scheduler')
    text_encoder = CLIPTextModel.from_pretrained(base, subfolder='text_encoder')
    vae = AutoencoderKL.from_pretrained(base, subfolder='vae')
    unet = UNet2DConditionModel.from_pretrained(base, subfolder='unet')
    for part in (vae, text_encoder, unet):
        part.requires_grad_(False)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights='gaussian',
                                target_modules=['to_k', 'to_q', 'to_v', 'to_out.0']))
    if text_lora:
        inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, init_lora_weights='gaussian',
                                           target_modules=['q_proj', 'k_proj', 'v_proj', 'out_proj']), text_encoder)
        for name, p in text_encoder.named_parameters():
            p.requires_grad_('lora_' in name)
    params = [p for p in unet.parameters() if p.requires_grad]
    if text_lora:
        params += [p for p in text_encoder.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
    dataset = _Images(instance_dir, class_dir, tokenizer, RESOLUTION)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, shuffle=True, collate_fn=_collate, num_workers=0)
    unet.train()
    text_encoder.train(text_lora)
    vae.eval()
    losses, step = [], 0
    for _ in range(math.ceil(STEPS / len(loader))):
        for pixels, ids in loader:
            latents = vae.encode(pixels).latent_dist.sample() * vae.config.scaling_factor
            noise = torch.randn_like(latents)
            timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],)).long()
            noisy = scheduler.add_noise(latents, noise, timesteps)
            pred = unet(noisy, timesteps, text_encoder(ids)[0]).sample
            if class_dir:
                pred, prior_pred = pred.chunk(2)
                target, prior_target = noise.chunk(2)
                loss = torch.nn.functional.mse_loss(pred.float(), target.float()) + \
                    torch.nn.functional.mse_loss(prior_pred.float(), prior_target.float())
            else:
                loss = torch.nn.functional.mse_loss(pred.float(), noise.float())
            loss.backward()
            clip = itertools.chain(unet.parameters(), text_encoder.parameters()) if text_lora else unet.parameters()
            torch.nn.utils.clip_grad_norm_(clip, 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            if step == STEPS:
                break
    text_layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(text_encoder)) if text_lora else None
    StableDiffusionPipeline.save_lora_weights(
        out_dir, unet_lora_layers=convert_state_dict_to_diffusers(get_peft_model_state_dict(unet)),
        text_encoder_lora_layers=text_layers, safe_serialization=True)
    return losses


@HOOKS.register_module(force=True)
class RecordLossHook(Hook):
    def __init__(self):
        self.losses = []

    def after_train_iter(self, trainer):
        self.losses.append(trainer.outputs['loss'].item())


def hookloop_lora_run(base, instance_dir, class_dir, text_lora, work_dir):
    """The same flags, spelt as diffusers' (where they mean the same) and hookloop's."""
    prior = dict(with_prior_preservation=True, class_prompt='a dog', class_data_dir=class_dir,
                 num_class_images=1) if class_dir else {}
    trainer = build_trainer('dreambooth_diffusion', default_args=dict(
        pretrained_model_name_or_path=base, instance_data_dir=instance_dir, instance_prompt='a sks dog',
        resolution=RESOLUTION, lora=dict(rank=4), train_text_encoder=text_lora, seed=SEED,
        learning_rate=LR, max_train_steps=STEPS, train_batch_size=1, output_dir=work_dir, device='cpu',
        custom_hooks=[dict(type='RecordLossHook')], log_config=dict(interval=1), **prior))
    hook = next(h for h in trainer.hooks if isinstance(h, RecordLossHook))
    train(trainer)
    return hook.losses


@pytest.mark.parametrize('prior', [False, True], ids=['no-prior', 'prior'])
@pytest.mark.parametrize('text_lora', [False, True], ids=['unet-lora', 'text-encoder-lora'])
def test_same_seed_and_flags_give_the_scripts_losses_and_lora_file(tmp_path, base, data, prior, text_lora):
    from safetensors.torch import load_file
    instance_dir, class_dir = data
    class_dir = class_dir if prior else None
    expected = plain_lora_run(base, instance_dir, class_dir, text_lora, str(tmp_path / 'plain'))
    got = hookloop_lora_run(base, instance_dir, class_dir, text_lora, str(tmp_path / 'work'))
    assert got == expected  # bitwise, every step
    a = load_file(str(tmp_path / 'work' / 'pipeline' / 'pytorch_lora_weights.safetensors'))
    b = load_file(str(tmp_path / 'plain' / 'pytorch_lora_weights.safetensors'))
    assert a.keys() == b.keys() and any(k.startswith('text_encoder.') for k in a) == text_lora
    assert all(torch.equal(a[k], b[k]) for k in a)
