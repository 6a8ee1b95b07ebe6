"""hookloop's ``dreambooth_diffusion`` against a plain PyTorch loop that does the step of
diffusers' ``examples/dreambooth/train_dreambooth.py`` (and ``train_dreambooth_lora.py``),
on the same tiny random Stable Diffusion pipeline.

    PYTHONPATH=. python bench/dreambooth_vs_plain.py [--steps 20] [--resolution 32]

diffusers' scripts themselves need torchvision and accelerate, which this project does not
install; the plain loop below follows their step line by line (VAE sample x scaling factor,
noise, timesteps, ``add_noise``, UNet, float32 MSE, backward, clip to ``max_grad_norm``,
AdamW step, zero_grad), with the same data order and seed. Each variant runs in its own
process (so peak memory is its own): median step time after 3 warm-up steps, the peak
resident memory during training above the resident memory before it (``VmHWM`` reset via
``/proc/self/clear_refs``), and the checkpoint bytes of each. Prints one JSON line per run
and whether the final trained weights of both are bitwise equal.
"""
import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

import torch

PROMPT = 'a photo of sks dog'


def subject_pixels(resolution, count=2):
    generator = torch.Generator().manual_seed(0)
    return torch.rand(count, 3, resolution, resolution, generator=generator) * 2 - 1


def rss_mib(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    return None


def reset_peak():
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # resets VmHWM to the current RSS
    except OSError:
        pass


def lora_config(rank):
    from peft import LoraConfig
    return LoraConfig(r=rank, lora_alpha=rank, init_lora_weights='gaussian',
                      target_modules=['to_q', 'to_k', 'to_v', 'to_out.0'])


def plain_diffusers_step_loop(pretrained, steps, resolution, lora_rank, lr=1e-4, max_grad_norm=1.0, seed=0,
                              on_step=None):
    """diffusers' DreamBooth step as a plain loop; returns the trained UNet."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer
    import torch.nn.functional as F
    from hookloop.data.resumable import seed_everything
    seed_everything(seed)
    tokenizer = CLIPTokenizer.from_pretrained(pretrained, subfolder='tokenizer')
    text_encoder = CLIPTextModel.from_pretrained(pretrained, subfolder='text_encoder')
    vae = AutoencoderKL.from_pretrained(pretrained, subfolder='vae')
    unet = UNet2DConditionModel.from_pretrained(pretrained, subfolder='unet')
    scheduler = DDPMScheduler.from_pretrained(pretrained, subfolder='scheduler')
    vae.requires_grad_(False)
    text_encoder.requires_grad_(False)
    if lora_rank:
        unet.requires_grad_(False)
        unet.add_adapter(lora_config(lora_rank))
    vae.eval()
    text_encoder.eval()
    unet.train()
    # No second seed after LoRA's initialisation (as diffusers' script); each epoch draws two
    # numbers from the global RNG as torch's DataLoader with shuffle=True does (below).
    params = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    data = subject_pixels(resolution)
    ids = tokenizer(PROMPT, padding='max_length', max_length=tokenizer.model_max_length, truncation=True,
                    return_tensors='pt').input_ids
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()  # epoch 0
    for step in range(steps):
        if step and step % len(data) == 0:
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed + step // len(data))).tolist()
        if step % len(data) == 0:
            torch.empty((), dtype=torch.int64).random_()  # the DataLoader's base seed
            torch.empty((), dtype=torch.int64).random_()  # its RandomSampler's seed
        pixels = data[order[step % len(data)]:order[step % len(data)] + 1]
        start = time.perf_counter()
        with torch.no_grad():
            latents = vae.encode(pixels).latent_dist.sample() * vae.config.scaling_factor
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],))
        noisy = scheduler.add_noise(latents, noise, timesteps)
        with torch.no_grad():
            states = text_encoder(ids)[0]
        prediction = unet(noisy, timesteps, states).sample
        loss = F.mse_loss(prediction.float(), noise.float(), reduction='mean')
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        if on_step is not None:
            on_step(time.perf_counter() - start)
    return unet


def hookloop_run(pretrained, steps, resolution, lora_rank, work_dir, lr=1e-4, on_step=None, checkpoint=False):
    from hookloop import Hook, build_trainer

    class Timer(Hook):
        def before_train_iter(self, trainer):
            self.start = time.perf_counter()

        def after_train_iter(self, trainer):
            if on_step is not None:
                on_step(time.perf_counter() - self.start)

    trainer = build_trainer('dreambooth_diffusion', default_args=dict(
        model=pretrained, instance_data=subject_pixels(resolution), instance_prompt=PROMPT,
        lora=dict(rank=lora_rank, alpha=lora_rank) if lora_rank else None, center_crop=True,
        optimizer=dict(type='AdamW', lr=lr), max_iters=steps, work_dir=work_dir, seed=0, device='cpu',
        log_config=dict(interval=steps), custom_hooks=[Timer()], pipeline_dir=None, log_level='WARNING',
        checkpoint_config=dict(interval=steps, by_epoch=False) if checkpoint else None))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer.model.unet


def _child(kind, pretrained, args, lora_rank, work_dir, queue):
    torch.set_num_threads(1)
    times = []
    baseline = rss_mib('VmRSS')
    reset_peak()
    if kind == 'plain':
        unet = plain_diffusers_step_loop(pretrained, args.steps, args.resolution, lora_rank, on_step=times.append)
    else:
        unet = hookloop_run(pretrained, args.steps, args.resolution, lora_rank, work_dir, on_step=times.append)
    peak = rss_mib('VmHWM') - baseline
    from safetensors.torch import save_file  # a file, not a tensor through the queue (the child exits)
    os.makedirs(work_dir, exist_ok=True)
    weights = os.path.join(work_dir, 'unet.safetensors')
    save_file({k: v.contiguous() for k, v in unet.state_dict().items()}, weights)
    queue.put(dict(kind=kind, lora_rank=lora_rank, step_ms=round(1000 * statistics.median(times[3:] or times), 1),
                   peak_rss_mib=round(peak, 1), weights=weights))


def checkpoint_sizes(pretrained, resolution, lora_rank, work_dir):
    """Bytes of one checkpoint with and without the frozen weights."""
    from hookloop import build_trainer
    sizes = {}
    for save_frozen in (True, False):
        directory = os.path.join(work_dir, f'ckpt_{lora_rank}_{save_frozen}')
        trainer = build_trainer('dreambooth_diffusion', default_args=dict(
            model=pretrained, instance_data=subject_pixels(resolution), instance_prompt=PROMPT,
            lora=dict(rank=lora_rank, alpha=lora_rank) if lora_rank else None,
            optimizer=dict(type='AdamW', lr=1e-4), max_iters=1, work_dir=directory, seed=0, device='cpu',
            log_level='WARNING', pipeline_dir=None,
            checkpoint_config=dict(interval=1, by_epoch=False, save_frozen=save_frozen)))
        try:
            trainer.train()
        finally:
            trainer.close()
        sizes['full' if save_frozen else 'trained_only'] = os.path.getsize(os.path.join(directory, 'iter_1.pth'))
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--resolution', type=int, default=32)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from hookloop.dreambooth.random_pipeline import save_random_pipeline
    context = multiprocessing.get_context('spawn')
    with tempfile.TemporaryDirectory() as work:
        pretrained = save_random_pipeline(os.path.join(work, 'sd'), resolution=args.resolution)
        for lora_rank in (0, 4):
            results = {}
            for kind in ('plain', 'hookloop', 'plain', 'hookloop'):  # interleaved, best of two
                queue = context.Queue()
                process = context.Process(target=_child, args=(kind, pretrained, args, lora_rank,
                                                                os.path.join(work, f'{kind}_{lora_rank}_{len(results)}'),
                                                                queue))
                process.start()
                result = queue.get()
                process.join()
                best = results.get(kind)
                if best is None or result['step_ms'] < best['step_ms']:
                    results[kind] = result
            from safetensors.torch import load_file
            plain, ours = load_file(results['plain']['weights']), load_file(results['hookloop']['weights'])
            equal = plain.keys() == ours.keys() and all(torch.equal(plain[k], v) for k, v in ours.items())
            for kind in ('plain', 'hookloop'):
                row = {k: v for k, v in results[kind].items() if k != 'weights'}
                print(json.dumps(row), flush=True)
            print(json.dumps(dict(lora_rank=lora_rank, bitwise_equal_weights=equal,
                                  checkpoint_bytes=checkpoint_sizes(pretrained, args.resolution, lora_rank, work))),
                  flush=True)


if __name__ == '__main__':
    main()
