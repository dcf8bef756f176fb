"""An app with one job: ``manage.py runserver`` is ``manage.py serve`` (``runs.management.commands.serve``).

Listed first in ``INSTALLED_APPS`` so that its ``runserver`` wins over
``django.contrib.staticfiles``' (Django takes a command from the first
app that has it). Without it, ``runserver`` would be Django's WSGI
development server, which never loads ``config.asgi``: no WebSockets, no
request-body limit, no ``SECRET_KEY`` check before it listens. Daphne's
own app did this job before, at the price of importing Daphne's server
(Twisted, OpenSSL) into every process, workers included.
"""
