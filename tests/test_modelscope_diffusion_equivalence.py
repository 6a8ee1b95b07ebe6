"""Issue 37: given the same batches and noise draws, ModelScope's DreamBooth (prior preservation
on and off) and LoRA trainers on hookloop give the per-step losses and the weights of a plain
loop written from the steps of ModelScope's trainers (``DreamboothDiffusionTrainer.train_step``,
``StableDiffusion.forward``, ``LoraDiffusionTrainer``):

* seed 42 (``EpochBasedTrainer(seed=42)``), the parts of the model directory, AdamW over the
  UNet's parameters (DreamBooth) or over LoRA adapters of rank r with alpha r on every attention
  projection (LoRA; ``LoRAAttnProcessor`` has no alpha scaling);
* per step: the batch's images through the VAE (``latent_dist.sample()``), noise, timesteps, the
  captions tokenized and encoded as one batch, the UNet, the MSE; with prior preservation one
  class image the same way, its loss times ``prior_loss_weight`` added; backward, step.

Where the loop and ModelScope's trainer may differ, and how the test makes them equal: the batch
order (ModelScope's ``RandomSampler`` draws its order from the global RNG at each epoch, hookloop's
resumable sampler orders an epoch from ``(seed, epoch)``) and the class image of each step
(ModelScope cycles a shuffled loader, hookloop takes ``order[iter % n]`` of a permutation seeded
from the run's seed) are taken from the hookloop run; and the global RNG draws of ModelScope's
loaders (two int64 per train epoch and at the first class batch: the loaders' base seed and the
sampler's seed) are not made, since hookloop's samplers draw nothing from it. Every other draw
is ModelScope's, in ModelScope's order.
"""
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from conftest import train_and_close as train
from hookloop import Hook, build_trainer
from hookloop.dreambooth.dataset import image_to_tensor
from modelscope_sd_helpers import make_dataset_dir, model_dir, noise_png, one_thread, rows_of  # noqa: F401 (fixtures)

pytest.importorskip('diffusers')
pytest.importorskip('peft')

STEPS = 5


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return make_dataset_dir(tmp_path_factory.mktemp('eq_data'), rows=STEPS)


class Steps(Hook):
    """The batches, class images and losses of a run, step by step."""

    def __init__(self):
        self.batches, self.losses = [], []

    def after_train_iter(self, trainer):
        self.batches.append({k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in trainer.data_batch.items()})
        self.losses.append(trainer.outputs['loss'].detach().clone())


def modelscope_run(name, model_dir, data_dir, work_dir, **kwargs):
    def one_epoch(cfg):
        cfg.train.max_epochs = 1
        cfg.train.lr_scheduler = {'type': 'LambdaLR', 'lr_lambda': lambda _: 1, 'last_epoch': -1}
        cfg.train.checkpoint = {'period': {'save_strategy': 'no'}}
        return cfg
    steps = Steps()
    trainer = build_trainer(name, default_args=dict(model=model_dir, work_dir=str(work_dir), device='cpu',
                                                    train_dataset=rows_of(data_dir), cfg_modify_fn=one_epoch,
                                                    callbacks=[steps], **kwargs))
    train(trainer)
    return trainer, steps


def plain_modelscope_loop(model_dir, batches, class_items=None, prior_loss_weight=1.0, lora_rank=None):
    """ModelScope's steps, written out: returns the per-step losses and the trained UNet."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer
    torch.manual_seed(42)
    tokenizer = CLIPTokenizer.from_pretrained(model_dir, subfolder='tokenizer')
    text_encoder = CLIPTextModel.from_pretrained(model_dir, subfolder='text_encoder')
    vae = AutoencoderKL.from_pretrained(model_dir, subfolder='vae')
    unet = UNet2DConditionModel.from_pretrained(model_dir, subfolder='unet')
    noise_scheduler = DDPMScheduler.from_pretrained(model_dir, subfolder='scheduler')
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    if lora_rank is not None:
        from peft import LoraConfig
        unet.requires_grad_(False)
        unet.add_adapter(LoraConfig(r=lora_rank, lora_alpha=lora_rank, init_lora_weights='gaussian',
                                    target_modules=['to_q', 'to_k', 'to_v', 'to_out.0']))
    optimizer = torch.optim.AdamW([p for p in unet.parameters() if p.requires_grad], lr=1e-4, weight_decay=1e-2)
    torch.manual_seed(42)  # the trainer's seed_everything when it starts

    def loss_of(target, texts):
        with torch.no_grad():
            latents = vae.encode(target).latent_dist.sample()
        latents = latents * vae.config.scaling_factor
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, noise_scheduler.config.num_train_timesteps, (latents.shape[0],)).long()
        noisy = noise_scheduler.add_noise(latents, noise, timesteps)
        ids = tokenizer(texts, max_length=tokenizer.model_max_length, padding='max_length', truncation=True,
                        return_tensors='pt').input_ids
        with torch.no_grad():
            states = text_encoder(ids)[0]
        prediction = unet(noisy, timesteps, states).sample
        return F.mse_loss(prediction.float(), noise.float(), reduction='mean')

    losses = []
    unet.train()
    for step, batch in enumerate(batches):
        loss = loss_of(batch['target'], batch['text'])
        if class_items is not None:  # ModelScope's class loader: Resize, RandomCrop, ToTensor, Normalize
            path, text = class_items[step]
            with Image.open(path) as image:
                target = image_to_tensor(image, 16, center_crop=False, normalize=((0.5,), (0.5,)))
            loss = loss + prior_loss_weight * loss_of(target.unsqueeze(0), [text])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses, unet


@pytest.mark.parametrize('prior', [False, True], ids=['no_prior', 'prior'])
def test_dreambooth_steps_equal_modelscopes(tmp_path, model_dir, data_dir, prior):
    extra = {}
    if prior:
        classes = tmp_path / 'class'
        classes.mkdir()
        for index in range(3):
            noise_png(str(classes / f'class_{index:05d}.png'), 70 + index, size=(18, 16))  # cropped at random
        extra = dict(with_prior_preservation=True, class_data_dir=str(classes), num_class_images=3, resolution=16,
                     prior_loss_weight=0.5)
    trainer, steps = modelscope_run('dreambooth-diffusion', model_dir, data_dir, tmp_path / 'work', **extra)
    assert len(steps.losses) == STEPS
    class_items = None
    if prior:  # the class image file each step took (its random crop is drawn inside the step, in both)
        rows = [trainer.class_rows.rows[int(trainer.class_order[step % 3])] for step in range(STEPS)]
        class_items = [(row['Target:FILE'], row['Text']) for row in rows]
    losses, unet = plain_modelscope_loop(model_dir, steps.batches, class_items, 0.5)
    assert [loss.item() for loss in losses] == [loss.item() for loss in steps.losses]
    for key, value in unet.state_dict().items():
        assert torch.equal(trainer.model.unet.state_dict()[key], value), key


def test_lora_steps_equal_modelscopes(tmp_path, model_dir, data_dir):
    trainer, steps = modelscope_run('lora-diffusion', model_dir, data_dir, tmp_path / 'work', lora_rank=4)
    losses, unet = plain_modelscope_loop(model_dir, steps.batches, lora_rank=4)
    assert [loss.item() for loss in losses] == [loss.item() for loss in steps.losses]
    trained = {k: v for k, v in trainer.model.unet.state_dict().items() if 'lora_' in k}
    assert trained and all(torch.equal(unet.state_dict()[k], v) for k, v in trained.items())
