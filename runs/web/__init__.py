"""The runs pages and live pushes (views, forms, URLs, Channels consumers and routing): a surface (tests/unit/test_layers.py)."""
