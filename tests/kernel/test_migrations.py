"""The models and their migrations agree: no change is left without a migration, and no app has two leaves."""

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_every_model_change_has_its_migration_and_the_graph_has_one_leaf_per_app(capsys):
    call_command("makemigrations", "--check", "--dry-run")  # exits non-zero on a missing migration or a conflict
    assert "No changes detected" in capsys.readouterr().out
