"""Data: resumable seeded samplers, the train stream (map-style, iterable, HF ``datasets``),
its saved state and device prefetch.
May import: ``dist``, ``checkpoint``, ``fileio``, ``registry``, ``errors``.
"""
