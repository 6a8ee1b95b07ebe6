"""Data: resumable seeded samplers, the train stream (map-style, iterable, HF ``datasets``),
its saved state, moving a batch to the device and device prefetch.
May import: ``dist``, ``checkpoint``, ``fileio``, ``config``, ``registry``, ``priority``, ``errors``.
"""
