"""The runs API (DRF views, serializers, filters): a surface (tests/unit/test_layers.py)."""
