"""The shared base: shapes, errors, words and plumbing every layer may import; imports nothing above it (tests/unit/test_layers.py)."""
