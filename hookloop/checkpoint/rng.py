"""The Python, NumPy, torch (and CUDA) random generators' state, in a ``weights_only``-safe form
(plain containers and tensors), so a checkpoint that holds it loads without unpickling code."""
import random

import numpy as np
import torch


def get_rng_state():
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        'python': {'version': version, 'state': list(internal), 'gauss': gauss},
        'numpy': {'name': name, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
                  'has_gauss': int(has_gauss), 'cached_gaussian': float(cached)},
        'torch': torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state):
    python = state['python']
    random.setstate((python['version'], tuple(python['state']), python['gauss']))
    numpy = state['numpy']
    # A checkpoint loaded with map_location='cuda' has its RNG tensors on the GPU;
    # the generators take CPU byte tensors.
    np.random.set_state((numpy['name'], numpy['keys'].cpu().numpy().astype(np.uint32), numpy['pos'],
                         numpy['has_gauss'], numpy['cached_gaussian']))
    torch.set_rng_state(state['torch'].cpu())
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state['cuda']])
