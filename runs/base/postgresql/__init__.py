"""Django's PostgreSQL backend, with one addition for group commit (``base.DatabaseWrapper``)."""
