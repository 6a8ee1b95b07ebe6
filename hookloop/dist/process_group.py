"""torch.distributed set-up, model wrapping and small helpers.

hookloop has no launcher of its own: ``torchrun`` starts the processes and describes
them in environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``); :func:`init_distributed` joins the process group they describe.
Every helper works, as the single-process identity, when no group is initialised.
"""
import atexit
import datetime
import os

import torch
import torch.distributed as torch_dist

from ..errors import ConfigError

LAUNCHERS = ('auto', 'none', 'pytorch', 'torchrun')
STRATEGIES = ('none', 'ddp', 'fsdp')
_TORCHRUN_VARS = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')

# True while a process group that hookloop itself created is alive; only that one is
# destroyed by :func:`teardown` (a group the user made is theirs to close).
_owned_group = False


def is_distributed():
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank():
    return torch_dist.get_rank() if is_distributed() else 0


def get_world_size():
    return torch_dist.get_world_size() if is_distributed() else 1


def get_local_rank():
    """The process's index on its machine (``LOCAL_RANK`` from torchrun), 0 otherwise."""
    return int(os.environ.get('LOCAL_RANK', 0)) if is_distributed() else 0


def is_main_process():
    return get_rank() == 0


def broadcast_object(obj, src=0):
    """``obj`` as rank ``src`` has it, on every rank (identity when not distributed)."""
    if not is_distributed():
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_numbers(numbers):
    """Python numbers summed element-wise over ranks (one collective; identity when
    not distributed). Float64 on the backend's device, so counts stay exact."""
    if not is_distributed():
        return list(numbers)
    device = torch.device('cuda', torch.cuda.current_device()) if torch_dist.get_backend() == 'nccl' else 'cpu'
    tensor = torch.tensor([float(n) for n in numbers], dtype=torch.float64, device=device)
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor.tolist()


def all_gather_objects(obj):
    """``[obj of rank 0, obj of rank 1, ...]`` (``[obj]`` when not distributed)."""
    if not is_distributed():
        return [obj]
    gathered = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, obj)
    return gathered


def torchrun_env():
    """The torchrun variables present in the environment, as a dict."""
    return {name: os.environ[name] for name in _TORCHRUN_VARS if name in os.environ}


def _timeout(value):
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f'dist_timeout must be a positive number of seconds, got {value!r}')
    return datetime.timedelta(seconds=value)


def default_backend(device=None):
    """``'nccl'`` when the run is on CUDA, ``'gloo'`` otherwise."""
    if device is not None:
        cuda = torch.device(device).type == 'cuda'
    else:
        cuda = torch.cuda.is_available()
    return 'nccl' if cuda else 'gloo'


def init_distributed(launcher='auto', backend=None, timeout=1800, device=None):
    """Join the process group torchrun describes; returns ``(rank, world_size)``.

    Args:
        launcher: ``'auto'`` joins when the torchrun environment is present (``RANK`` and
            ``WORLD_SIZE`` set, a world of one included); ``'pytorch'`` / ``'torchrun'``
            require it; ``'none'`` always runs single-process.
        backend: ``'nccl'``, ``'gloo'``, ... ; ``None`` picks nccl on CUDA, gloo on CPU.
        timeout: seconds a collective may wait for the other ranks before it fails.
        device: the trainer's ``device`` argument (picks the backend and, on CUDA, the
            device is set to ``cuda:LOCAL_RANK``).

    A process group that already exists (made by the user) is used as it is.
    """
    global _owned_group
    if launcher not in LAUNCHERS:
        raise ConfigError(f'launcher must be one of {", ".join(LAUNCHERS)}, got {launcher!r}')
    timeout = _timeout(timeout)
    if backend is not None and not isinstance(backend, str):
        raise ConfigError(f'dist_backend must be a backend name such as "nccl" or "gloo", got {backend!r}')
    if launcher == 'none':
        return 0, 1
    if is_distributed():
        return get_rank(), get_world_size()
    env = torchrun_env()
    if 'RANK' not in env or 'WORLD_SIZE' not in env:
        if launcher == 'auto':
            return 0, 1
        missing = [name for name in _TORCHRUN_VARS if name not in env]
        raise ConfigError(f'launcher={launcher!r} needs the torchrun environment, but {", ".join(missing)} '
                          'are not set; start with `torchrun --nproc-per-node N ...` or use launcher="none"')
    if not torch_dist.is_available():
        raise ConfigError('this torch build has no torch.distributed; use launcher="none"')
    backend = backend or default_backend(device)
    if backend == 'nccl':
        if not torch.cuda.is_available():
            raise ConfigError('dist_backend="nccl" needs CUDA, which is not available; use dist_backend="gloo"')
        torch.cuda.set_device(int(env.get('LOCAL_RANK', 0)))
    try:
        torch_dist.init_process_group(backend=backend, timeout=timeout)
    except ValueError as exc:
        raise ConfigError(f'cannot initialise torch.distributed with backend {backend!r}: {exc}') from None
    _owned_group = True
    return torch_dist.get_rank(), torch_dist.get_world_size()


def teardown():
    """Destroy the process group if hookloop created it (safe to call many times)."""
    global _owned_group
    if _owned_group and is_distributed():
        torch_dist.destroy_process_group()
    _owned_group = False


# A normal interpreter exit tears down too (torch warns about a group left alive).
atexit.register(teardown)


def resolve_device(device=None):
    """The trainer's device: ``device`` as given, except that a bare ``'cuda'`` (or
    ``None`` with CUDA available) becomes ``cuda:LOCAL_RANK`` in a distributed run."""
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f'device {device!r} is not a device: {exc}') from None
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise ConfigError(f"device={str(device)!r}, but CUDA is not available here (torch {torch.__version__}); "
                          "use device='cpu' or None")
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', get_local_rank())
    return device


def resolve_strategy(strategy):
    """``strategy`` checked; ``None`` is ``'ddp'`` in a multi-process run, else ``'none'``."""
    if strategy is None:
        return 'ddp' if get_world_size() > 1 else 'none'
    if strategy not in STRATEGIES:
        raise ConfigError(f'strategy must be one of {", ".join(STRATEGIES)}, got {strategy!r}')
    if strategy != 'none' and not is_distributed():
        raise ConfigError(f'strategy={strategy!r} needs torch.distributed: launch with torchrun '
                          '(or use strategy="none")')
    return strategy


def wrap_model(model, strategy=None, device=None, find_unused_parameters=False):
    """The model the training step calls.

    ``'none'``: ``model`` itself. ``'ddp'``: ``DistributedDataParallel(model)``, whose
    ``no_sync()`` the optimizer hook uses inside an accumulation window. ``'fsdp'``:
    FSDP2 ``fully_shard`` applied to every direct child holding parameters and to the
    root, in place, so the returned object *is* ``model`` (parameters become DTensors).
    """
    strategy = resolve_strategy(strategy)
    if not isinstance(find_unused_parameters, bool):
        raise ConfigError(f'find_unused_parameters must be True or False, got {find_unused_parameters!r}')
    if strategy == 'none':
        return model
    if strategy == 'ddp':
        from torch.nn.parallel import DistributedDataParallel
        if not any(p.requires_grad for p in model.parameters()):
            raise ConfigError('strategy="ddp" needs a model with trainable parameters')
        device = torch.device(device) if device is not None else None
        device_ids = [device] if device is not None and device.type == 'cuda' else None
        return DistributedDataParallel(model, device_ids=device_ids,
                                       find_unused_parameters=find_unused_parameters)
    from .fsdp import shard_model
    return shard_model(model, device)


def unwrap_model(model):
    """The user's module inside a DDP wrapper (FSDP2 shards in place: itself)."""
    return getattr(model, 'module', model) if type(model).__name__ == 'DistributedDataParallel' else model
