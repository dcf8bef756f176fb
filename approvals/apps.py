from django.apps import AppConfig
from django.db.models.signals import post_delete
from django.utils.translation import gettext_lazy as _


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = _("Approvals inbox")

    def ready(self):
        """An answer file's stored bytes go when its row does (``approvals.answer_file_cleanup``); the
        ``input`` kind of wait is registered (``approvals.waits``)."""
        from approvals import waits  # noqa: F401
        from approvals.answer_file_cleanup import delete_stored_file

        post_delete.connect(delete_stored_file, sender=self.get_model("AnswerFile"),
                            dispatch_uid="approvals.delete_stored_answer_file")
