from .text import TextLoggerHook

__all__ = ['TextLoggerHook']
