"""``manage.py runserver``: ``manage.py serve`` under Django's usual name (see ``config.runserver``)."""

from runs.management.commands.serve import Command as Serve


class Command(Serve):
    """``serve``, taking runserver's ``--noreload`` too (``serve`` never reloads: nothing to turn off)."""

    help = "The same as manage.py serve: " + Serve.help

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--noreload", action="store_true", help="Accepted for runserver's sake; serve never reloads.")

    def handle(self, *args, noreload, **options):
        super().handle(*args, **options)
