"""Removing an answer file's stored bytes when its row goes (``approvals.models.AnswerFile``).

The row goes with its inbox item, which goes with its run or tool call
(``on_delete=CASCADE``), or on its own; Django sends ``post_delete`` for
every row a cascade removes, but leaves the storage alone. The receiver
below asks the storage to delete the file once the deleting transaction
commits (``transaction.on_commit``): a delete that rolls back keeps row
and file together. A storage that fails then is logged, not raised (the
rows are gone already; an orphaned file is only disk space).
"""

from django.db import transaction


def delete_stored_file(sender, instance, using, **kwargs) -> None:
    """``post_delete`` receiver for ``AnswerFile``: delete ``instance``'s stored file after commit (see module doc)."""
    name = instance.file.name
    if not name:
        return
    storage = instance.file.storage
    transaction.on_commit(lambda: storage.delete(name), using=using, robust=True)
