"""Django's PostgreSQL backend, with savepoints that a group commit leaves to its COMMIT (``base.DatabaseWrapper``).

``config.settings`` names it (``DATABASES["default"]["ENGINE"]``) in place of
``django.db.backends.postgresql`` whenever the database is PostgreSQL;
Django's documentation calls this "subclassing the built-in database backends".
"""
