"""The runs pages and live pushes (views, forms, URLs, Channels consumers and routing): a surface (tests/test_layers.py)."""
