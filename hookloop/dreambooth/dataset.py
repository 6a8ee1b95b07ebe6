"""DreamBooth's dataset: subject ("instance") samples paired with class samples.

Each item holds one instance sample and, with prior preservation, one class sample;
:func:`collate_dreambooth` puts all instance samples of a batch first and all class
samples after them, so one forward pass serves both loss terms.
"""
import os

import torch
from torch.utils.data import Dataset

from ..errors import ConfigError

IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg', '.webp', '.bmp')
SAMPLE_SUFFIXES = IMAGE_SUFFIXES + ('.safetensors',)


def list_samples(directory):
    """The sample files of ``directory`` (images or ``.safetensors``), sorted by name."""
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.lower().endswith(SAMPLE_SUFFIXES) and not name.startswith('.'))


def image_to_tensor(image, resolution, channels=3, center_crop=True, random_flip=False):
    """A PIL image as diffusers' DreamBooth script prepares it: EXIF orientation applied,
    converted to RGB (or grey), the shorter side resized to ``resolution`` (bilinear), a
    ``resolution`` square cropped from the centre (``center_crop``) or at a random place,
    mirrored with probability 1/2 (``random_flip``); a ``(channels, resolution, resolution)``
    float tensor in [-1, 1]. Random draws use the global torch RNG in the order and form of
    torchvision's ``RandomCrop`` and ``RandomHorizontalFlip`` (restored on resume)."""
    from PIL import Image, ImageOps
    image = ImageOps.exif_transpose(image)
    image = image.convert('L' if channels == 1 else 'RGB')
    if resolution is not None:
        scale = resolution / min(image.size)
        size = (max(resolution, round(image.size[0] * scale)), max(resolution, round(image.size[1] * scale)))
        image = image.resize(size, Image.BILINEAR)
        if center_crop:
            left, top = (size[0] - resolution) // 2, (size[1] - resolution) // 2
        else:
            top = int(torch.randint(0, size[1] - resolution + 1, size=(1,)).item())
            left = int(torch.randint(0, size[0] - resolution + 1, size=(1,)).item())
        image = image.crop((left, top, left + resolution, top + resolution))
    if random_flip and torch.rand(1) < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    data = data.view(image.size[1], image.size[0], channels).permute(2, 0, 1)
    return data.float() / 127.5 - 1.0


def tensor_to_image(sample):
    """A ``(C, H, W)`` tensor in [-1, 1] as a PIL image (C = 1 or 3)."""
    from PIL import Image
    data = ((sample.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    data = data.permute(1, 2, 0).contiguous().numpy()
    return Image.fromarray(data[..., 0] if data.shape[-1] == 1 else data)


def load_sample(path, resolution=None, channels=3, center_crop=True, random_flip=False):
    if path.lower().endswith('.safetensors'):
        from safetensors.torch import load_file
        return load_file(path)['sample']
    from PIL import Image
    with Image.open(path) as image:
        return image_to_tensor(image, resolution, channels, center_crop, random_flip)


class DreamBoothDataset(Dataset):
    """Instance samples with their prompt, and optionally class samples with theirs.

    Args:
        instance_samples: a list of file paths, a tensor ``(N, ...)`` or a list of tensors
            (already in [-1, 1] at the model's sample shape).
        instance_prompt: the prompt with the subject's identifier, e.g. ``'a sks dog'``.
        class_data_dir, class_prompt, num_class_images: where the class samples are and
            how many to use (None: no prior preservation).
        resolution, channels: what image files are resized / converted to.
        center_crop, random_flip: how image files are cropped and mirrored (see
            :func:`image_to_tensor`), instance and class images alike (as diffusers does).

    The length is ``max(#instance, num_class_images)``; instance samples repeat.
    """

    def __init__(self, instance_samples, instance_prompt, class_data_dir=None, class_prompt=None,
                 num_class_images=0, resolution=None, channels=3, center_crop=True, random_flip=False):
        self.instance_samples = list(instance_samples)
        self.instance_prompt = instance_prompt
        self.class_data_dir, self.class_prompt = class_data_dir, class_prompt
        self.num_class_images = num_class_images if class_data_dir is not None else 0
        self.resolution, self.channels = resolution, channels
        self.center_crop, self.random_flip = center_crop, random_flip
        self.class_samples = None  # listed on first use, after the trainer generated them

    def __len__(self):
        return max(len(self.instance_samples), self.num_class_images)

    def refresh_class_samples(self):
        """List the class samples now present (the trainer calls this after generating)."""
        if self.class_data_dir is None:
            return
        if not os.path.isdir(self.class_data_dir):
            raise ConfigError(f'class_data_dir {self.class_data_dir!r} does not exist yet: the trainer generates '
                              'the class samples when train() starts (or call generate_class_images())')
        found = list_samples(self.class_data_dir)[:self.num_class_images]
        if len(found) < self.num_class_images:
            raise ConfigError(f'class_data_dir {self.class_data_dir!r} holds {len(found)} samples, '
                              f'{self.num_class_images} are needed (num_class_images)')
        self.class_samples = found

    def _load(self, sample):
        if isinstance(sample, torch.Tensor):
            return sample.float()
        return load_sample(sample, self.resolution, self.channels, self.center_crop, self.random_flip)

    def __getitem__(self, index):
        item = {'instance': self._load(self.instance_samples[index % len(self.instance_samples)]),
                'instance_prompt': self.instance_prompt}
        if self.class_data_dir is not None:
            if self.class_samples is None:
                self.refresh_class_samples()
            item['class'] = self._load(self.class_samples[index % len(self.class_samples)])
            item['class_prompt'] = self.class_prompt
        return item


def collate_dreambooth(items):
    """``{'pixel_values': (instance..., class...), 'prompts': [...]}``: instance samples
    first, class samples after, so the loss can split the batch in two halves."""
    samples = [item['instance'] for item in items]
    prompts = [item['instance_prompt'] for item in items]
    if 'class' in items[0]:
        samples += [item['class'] for item in items]
        prompts += [item['class_prompt'] for item in items]
    return {'pixel_values': torch.stack(samples), 'prompts': prompts}
