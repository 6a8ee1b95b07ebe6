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


# --image_interpolation_mode of diffusers' scripts: torchvision's InterpolationMode names and the
# PIL filters torchvision resizes PIL images with (nearest_exact is PIL's NEAREST there too).
INTERPOLATION_MODES = {'nearest': 0, 'nearest_exact': 0, 'bilinear': 2, 'bicubic': 3, 'box': 4, 'hamming': 5,
                       'lanczos': 1}


def check_interpolation(mode):
    if mode not in INTERPOLATION_MODES:
        raise ConfigError(f'dreambooth_diffusion image_interpolation_mode must be one of '
                          f'{", ".join(INTERPOLATION_MODES)}, got {mode!r}')
    return mode


def resized_size(width, height, size):
    """torchvision's ``Resize(size)`` output for an int ``size``: the shorter side becomes
    ``size``, the longer ``int(size * long / short)`` (truncated, not rounded)."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def center_crop_box(width, height, size):
    """torchvision's ``CenterCrop(size)`` box: offsets ``round((side - size) / 2)``, rounded
    half to even as Python's ``round``."""
    left, top = int(round((width - size) / 2.0)), int(round((height - size) / 2.0))
    return left, top, left + size, top + size


def random_crop_box(width, height, size):
    """torchvision's ``RandomCrop(size)`` box: nothing is drawn when the image already has
    the crop size; otherwise the top, then the left offset, from the global torch RNG."""
    if width == size and height == size:
        return 0, 0, size, size
    top = int(torch.randint(0, height - size + 1, size=(1,)).item())
    left = int(torch.randint(0, width - size + 1, size=(1,)).item())
    return left, top, left + size, top + size


def image_to_tensor(image, resolution, channels=3, center_crop=True, random_flip=False,
                    interpolation='bilinear', normalize=None):
    """A PIL image as diffusers' DreamBooth scripts prepare it: EXIF orientation applied,
    converted to RGB (or grey), resized as torchvision's ``Resize(resolution)`` with the
    PIL filter of ``interpolation`` (one of :data:`INTERPOLATION_MODES`; an image whose
    shorter side already is ``resolution`` is not resampled), cropped as ``CenterCrop`` or
    ``RandomCrop`` (``center_crop``), mirrored with probability 1/2 (``random_flip``); a
    ``(channels, resolution, resolution)`` float tensor in [-1, 1]. Random draws use the
    global torch RNG in the order and form of torchvision's ``RandomCrop`` and
    ``RandomHorizontalFlip`` (restored on resume). ``normalize=(mean, std)`` (per-channel
    sequences, or one value for every channel) gives torchvision's ``ToTensor`` +
    ``Normalize(mean, std)`` arithmetic instead, ``(x / 255 - mean) / std`` (ModelScope's
    preprocessors: mean = std = 0.5 is [-1, 1] too, rounded differently)."""
    from PIL import Image, ImageOps
    image = ImageOps.exif_transpose(image)
    image = image.convert('L' if channels == 1 else 'RGB')
    if resolution is not None:
        size = resized_size(image.size[0], image.size[1], resolution)
        if size != image.size:
            image = image.resize(size, INTERPOLATION_MODES[interpolation])
        box = (center_crop_box if center_crop else random_crop_box)(size[0], size[1], resolution)
        if box != (0, 0) + size:
            image = image.crop(box)
    if random_flip and torch.rand(1) < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    data = data.view(image.size[1], image.size[0], channels).permute(2, 0, 1)
    if normalize is None:
        return data.float() / 127.5 - 1.0
    mean, std = (torch.as_tensor(values, dtype=torch.float32).reshape(-1, 1, 1) for values in normalize)
    return (data.float().div(255) - mean) / std


def follow_umask(directory):
    """Give the ``.safetensors`` files under ``directory`` the mode new files get (``0o666``
    less the umask): safetensors' writer makes them 0600, unlike every other file a run writes."""
    mask = os.umask(0o022)
    os.umask(mask)
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            if name.endswith('.safetensors') and not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


def tensor_to_image(sample):
    """A ``(C, H, W)`` tensor in [-1, 1] as a PIL image (C = 1 or 3)."""
    from PIL import Image
    data = ((sample.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    data = data.permute(1, 2, 0).contiguous().numpy()
    return Image.fromarray(data[..., 0] if data.shape[-1] == 1 else data)


def load_sample(path, resolution=None, channels=3, center_crop=True, random_flip=False, interpolation='bilinear'):
    if path.lower().endswith('.safetensors'):
        from safetensors.torch import load_file
        return load_file(path)['sample']
    from PIL import Image
    with Image.open(path) as image:
        return image_to_tensor(image, resolution, channels, center_crop, random_flip, interpolation)


class DreamBoothDataset(Dataset):
    """Instance samples with their prompt, and optionally class samples with theirs.

    Args:
        instance_samples: a list of file paths, a tensor ``(N, ...)`` or a list of tensors
            (already in [-1, 1] at the model's sample shape).
        instance_prompt: the prompt with the subject's identifier, e.g. ``'a sks dog'``.
        class_data_dir, class_prompt, num_class_images: where the class samples are and
            how many to use (None: no prior preservation).
        resolution, channels: what image files are resized / converted to.
        center_crop, random_flip, interpolation: how image files are resized, cropped and
            mirrored (see :func:`image_to_tensor`), instance and class images alike (as
            diffusers does).

    The length is ``max(#instance, num_class_images)``; instance samples repeat.
    """

    def __init__(self, instance_samples, instance_prompt, class_data_dir=None, class_prompt=None,
                 num_class_images=0, resolution=None, channels=3, center_crop=True, random_flip=False,
                 interpolation='bilinear'):
        self.instance_samples = list(instance_samples)
        self.instance_prompt = instance_prompt
        self.class_data_dir, self.class_prompt = class_data_dir, class_prompt
        self.num_class_images = num_class_images if class_data_dir is not None else 0
        self.resolution, self.channels = resolution, channels
        self.center_crop, self.random_flip = center_crop, random_flip
        self.interpolation = check_interpolation(interpolation)
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
        return load_sample(sample, self.resolution, self.channels, self.center_crop, self.random_flip,
                           self.interpolation)

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
