"""A DDPM noise schedule (Ho et al., 2020) as pure functions on tensors.

The tiny back-end trains and samples with it; the diffusers back-end uses the
scheduler stored with the pipeline instead.
"""
import torch


class DDPMSchedule:
    """Linear betas over ``num_steps`` steps.

    Args:
        num_steps: diffusion steps T (timesteps are 0 .. T-1).
        beta_start, beta_end: the first and last beta.
    """

    def __init__(self, num_steps=100, beta_start=1e-4, beta_end=0.2):
        self.num_steps = num_steps
        self.betas = torch.linspace(beta_start, beta_end, num_steps, dtype=torch.float64)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)

    def at(self, values, timesteps, like):
        """``values[timesteps]`` shaped to broadcast over a batch like ``like``."""
        picked = values.to(like.device)[timesteps].to(like.dtype)
        return picked.reshape(-1, *([1] * (like.dim() - 1)))

    def add_noise(self, samples, noise, timesteps):
        """``q(x_t | x_0)``: ``sqrt(abar_t) * x_0 + sqrt(1 - abar_t) * noise``."""
        abar = self.at(self.alphas_cumprod, timesteps, samples)
        return abar.sqrt() * samples + (1 - abar).sqrt() * noise

    def step(self, eps, t, x_t, noise):
        """One ancestral sampling step ``x_t -> x_{t-1}`` given the predicted noise ``eps``
        at the (scalar) timestep ``t`` and fresh Gaussian ``noise`` (unused at t = 0)."""
        beta, alpha, abar = (float(v[t]) for v in (self.betas, self.alphas, self.alphas_cumprod))
        mean = (x_t - beta / (1 - abar) ** 0.5 * eps) / alpha ** 0.5
        if t == 0:
            return mean
        abar_prev = float(self.alphas_cumprod[t - 1])
        variance = beta * (1 - abar_prev) / (1 - abar)  # the posterior variance, beta-tilde
        return mean + variance ** 0.5 * noise
