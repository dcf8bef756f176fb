"""Removing an answer file's stored bytes when its row goes (``approvals.models.AnswerFile``).

A ``post_delete`` receiver (cascades included: Django leaves the storage
alone) deletes the file once the deleting transaction commits, so a delete
that rolls back keeps row and file together. A storage failure then is
logged, not raised: the rows are gone, an orphaned file is only disk space.
"""

from django.db import transaction


def delete_stored_file(sender, instance, using, **kwargs) -> None:
    """``post_delete`` receiver for ``AnswerFile``: delete ``instance``'s stored file after commit (see module doc)."""
    name = instance.file.name
    if not name:
        return
    storage = instance.file.storage
    transaction.on_commit(lambda: storage.delete(name), using=using, robust=True)
