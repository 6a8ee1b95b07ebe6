"""Small, download-free models and data for the examples and tests (registered in ``MODELS`` and
``DATASETS`` when ``custom_imports`` names them).
May import: ``engine`` and everything below it (today: ``registry``, ``errors``)."""
