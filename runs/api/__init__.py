"""The runs API (DRF views, serializers, filters): a surface (tests/test_layers.py)."""
