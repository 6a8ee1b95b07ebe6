"""A small, randomly initialised Stable Diffusion pipeline built from configs in code
(no download), for tests and benchmarks of the diffusers back-end."""
import json
import os
import string
import tempfile

import torch


def _tiny_tokenizer(max_length):
    """A CLIP tokenizer over single characters (no BPE merges)."""
    from transformers import CLIPTokenizer
    vocab = {'<|startoftext|>': 0, '<|endoftext|>': 1}
    for char in string.ascii_lowercase + string.digits + string.punctuation:
        vocab[char] = len(vocab)
        vocab[char + '</w>'] = len(vocab)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, 'vocab.json'), 'w', encoding='utf-8') as f:
            json.dump(vocab, f)
        with open(os.path.join(tmp, 'merges.txt'), 'w', encoding='utf-8') as f:
            f.write('#version: 0.2\n')
        return CLIPTokenizer(os.path.join(tmp, 'vocab.json'), os.path.join(tmp, 'merges.txt'),
                             model_max_length=max_length)


def save_random_pipeline(directory, resolution=16, vae_channels=(32, 64), unet_channels=(32, 64),
                         text_dim=32, text_layers=2, max_length=16, seed=0):
    """Write a random ``StableDiffusionPipeline`` to ``directory`` and return the path.

    The VAE down-samples by ``2 ** (len(vae_channels) - 1)``; the UNet's native size is
    ``resolution`` pixels.
    """
    from diffusers import AutoencoderKL, DDPMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel
    torch.manual_seed(seed)
    factor = 2 ** (len(vae_channels) - 1)
    tokenizer = _tiny_tokenizer(max_length)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=text_dim, intermediate_size=2 * text_dim, num_attention_heads=4,
        num_hidden_layers=text_layers, max_position_embeddings=max_length, bos_token_id=0, eos_token_id=1,
        pad_token_id=1))
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=list(vae_channels),
                        down_block_types=['DownEncoderBlock2D'] * len(vae_channels),
                        up_block_types=['UpDecoderBlock2D'] * len(vae_channels), sample_size=resolution)
    levels = len(unet_channels)
    unet = UNet2DConditionModel(
        sample_size=resolution // factor, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=list(unet_channels),
        down_block_types=['DownBlock2D'] + ['CrossAttnDownBlock2D'] * (levels - 1),
        up_block_types=['CrossAttnUpBlock2D'] * (levels - 1) + ['UpBlock2D'],
        cross_attention_dim=text_dim, attention_head_dim=8)
    scheduler = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                              beta_schedule='scaled_linear', clip_sample=False, steps_offset=1)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.save_pretrained(directory, safe_serialization=True)
    return os.fspath(directory)
