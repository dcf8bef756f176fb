"""The approvals pages (the inbox, workflow and bulk views, forms, downloads, URLs): a surface (tests/unit/test_layers.py)."""
