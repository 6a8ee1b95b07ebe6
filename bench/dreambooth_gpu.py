"""DreamBooth with the diffusers back-end on CUDA: 64x64 images, 50 training steps, in
fp16 and bf16 (through ``optimizer_config=dict(precision=...)``), with prior preservation.

    PYTHONPATH=. python bench/dreambooth_gpu.py                     # a random SD-shaped pipeline
    PYTHONPATH=. python bench/dreambooth_gpu.py --pretrained DIR    # a local SD 1.x/2.x pipeline
    PYTHONPATH=. python bench/dreambooth_gpu.py --lora 4 --widths tiny --precisions fp16   # SD-shaped LoRA
    PYTHONPATH=. python bench/dreambooth_gpu.py --device cpu --steps 2 --precisions fp32 --widths tiny  # smoke

Prints, per precision: median step time (ms, after 5 warm-up steps), peak CUDA memory
(MiB), the first and last logged loss, the size of the last checkpoint (only what trains:
``save_frozen=False``) and whether the saved pipeline (or, with ``--lora``, the base plus
``load_lora_weights``) loads and generates.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from hookloop import ConfigError, Hook, build_trainer
from hookloop.dreambooth.random_pipeline import save_random_pipeline


class StepTimer(Hook):
    """Wall time of each training iteration, synchronised with the device at the end of
    the iteration (a benchmark may sync; training hooks may not)."""

    def __init__(self):
        self.times, self.losses, self._start = [], [], None

    def before_train_iter(self, trainer):
        if trainer.device.type == 'cuda':
            torch.cuda.synchronize()
        self._start = time.perf_counter()

    def after_train_iter(self, trainer):
        if trainer.device.type == 'cuda':
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._start)
        self.losses.append(float(trainer.outputs['loss']))


def subject_images(directory, resolution, count=4):
    from PIL import Image
    os.makedirs(directory, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    for i in range(count):
        pixels = (torch.rand(resolution, resolution, 3, generator=generator) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(os.path.join(directory, f'subject_{i}.png'))
    return directory


WIDTHS = {  # SD 1.x layout (4 UNet levels, 3 with cross-attention; a 4-level VAE)
    'sd-half': dict(vae_channels=(64, 128, 256, 256), unet_channels=(128, 256, 512, 512), text_dim=512,
                    text_layers=4, max_length=77),
    'tiny': dict(vae_channels=(32, 32, 64, 64), unet_channels=(32, 64, 64, 64), text_dim=64, text_layers=2,
                 max_length=77),
}


def run(pretrained, precision, args, work):
    timer = StepTimer()
    optimizer_config = {} if precision == 'fp32' else dict(precision=precision)
    lora = dict(rank=args.lora, alpha=args.lora) if args.lora else None
    trainer = build_trainer('dreambooth_diffusion', default_args=dict(
        lora=lora, checkpoint_config=dict(interval=args.steps, by_epoch=False),
        model=dict(type='DiffusersDreamBooth', pretrained_model_name_or_path=pretrained,
                   num_inference_steps=args.inference_steps),
        instance_data_dir=subject_images(os.path.join(work, 'subject'), args.resolution),
        instance_prompt='a photo of sks dog', with_prior_preservation=True, class_prompt='a photo of dog',
        num_class_images=4, class_data_dir=os.path.join(work, 'class_samples'), resolution=args.resolution,
        train_dataloader=dict(batch_size=args.batch_size), optimizer=dict(type='AdamW', lr=1e-4 if lora else 5e-6),
        optimizer_config=optimizer_config, max_iters=args.steps, work_dir=os.path.join(work, precision),
        seed=0, device=args.device, log_config=dict(interval=10), custom_hooks=[timer]))
    if args.device.startswith('cuda'):
        torch.cuda.reset_peak_memory_stats()
    try:
        trainer.train()
    finally:
        trainer.close()
    from diffusers import StableDiffusionPipeline
    from hookloop.checkpoint.format import read_pointer
    checkpoint_mib = os.path.getsize(read_pointer(os.path.join(work, precision))) / 2 ** 20
    saved = os.path.join(work, precision, 'pipeline')
    if lora:
        pipe = StableDiffusionPipeline.from_pretrained(pretrained)
        pipe.load_lora_weights(saved)
    else:
        pipe = StableDiffusionPipeline.from_pretrained(saved)
    pipe = pipe.to(args.device)
    pipe.set_progress_bar_config(disable=True)
    image = pipe('a photo of sks dog', num_inference_steps=2, height=args.resolution, width=args.resolution,
                 output_type='np').images
    timed = timer.times[5:] or timer.times
    on_cuda = args.device.startswith('cuda')
    return dict(precision=precision, lora_rank=args.lora, checkpoint_mib=round(checkpoint_mib, 2),
                trained_params=sum(p.numel() for p in trainer.model.parameters() if p.requires_grad), step_ms=round(1000 * statistics.median(timed), 2),
                peak_mib=round(torch.cuda.max_memory_allocated() / 2 ** 20) if on_cuda else None,
                first_loss=timer.losses[0], last_loss=timer.losses[-1], generated=list(image.shape))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--pretrained', help='a local diffusers SD pipeline (default: a random SD-shaped one)')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--steps', type=int, default=50)
    parser.add_argument('--resolution', type=int, default=64)
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--inference-steps', type=int, default=10)
    parser.add_argument('--precisions', default='fp16,bf16')
    parser.add_argument('--lora', type=int, default=0, help='LoRA rank (0: fine-tune the whole UNet)')
    parser.add_argument('--widths', choices=sorted(WIDTHS), default='sd-half',
                        help='channel widths of the random SD-shaped pipeline')
    args = parser.parse_args()
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        raise SystemExit('no CUDA device: run with --device cpu --steps 2 --precisions fp32 for a smoke run')
    with tempfile.TemporaryDirectory() as work:
        pretrained = args.pretrained or save_random_pipeline(
            os.path.join(work, 'sd'), resolution=args.resolution, **WIDTHS[args.widths])
        for precision in args.precisions.split(','):
            try:
                print(json.dumps(run(pretrained, precision, args, work)), flush=True)
            except ConfigError as exc:  # e.g. an OptimizerHook without the precision option
                print(json.dumps(dict(precision=precision, error=str(exc))), flush=True)


if __name__ == '__main__':
    main()
