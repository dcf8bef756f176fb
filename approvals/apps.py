from django.apps import AppConfig
from django.db.models.signals import post_delete
from django.utils.translation import gettext_lazy as _


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = _("Approvals inbox")

    def ready(self):
        """Declares the email actor (``approvals.actors``), registers the expiry warnings as a sweep job and the
        ``input`` kind of wait (``approvals.waits``), and deletes an answer file's stored bytes when its row goes
        (``approvals.answer_file_cleanup``)."""
        from approvals import actors  # noqa: F401  (declared for every worker, as an import side effect)
        from approvals import waits  # noqa: F401  (registers the input kind)
        from approvals.answer_file_cleanup import delete_stored_file
        from approvals.notifications import warn_claimed_items_expiring
        from runs.sweeping import register_sweep_job

        post_delete.connect(delete_stored_file, sender=self.get_model("AnswerFile"),
                            dispatch_uid="approvals.delete_stored_answer_file")
        # After the engine's expiries (400, 500), before reconciliation (600): runs.engine.sweep_jobs.JOBS.
        register_sweep_job("warn_claimed_items_expiring", warn_claimed_items_expiring, order=550)
