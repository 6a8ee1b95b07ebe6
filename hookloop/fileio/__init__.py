"""Files and object storage: local paths and fsspec URLs, checksums while bytes stream,
the work dir and its lock.
May import: ``config``, ``registry``, ``priority``, ``errors``.
"""
