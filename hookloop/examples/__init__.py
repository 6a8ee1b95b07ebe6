"""Small, download-free models and data for the examples and tests."""
