"""A user's slow webhook endpoints take no capacity from runs, nor from other users' deliveries (issue 26).

Real parts throughout: the workers ``manage.py serve`` starts
(``embedded_workers``: one for the run queues, one for ``webhooks``), real
HTTP endpoints on loopback (``tests.support.webhook_receiver.Receiver``), runs
started and advanced as in production. A stranger (no permissions) points
many subscriptions at an endpoint that holds every request, answering
nothing until the test releases it.
"""

import contextlib

import dramatiq
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from runs.engine.lifecycle import start_run
from runs.management.commands.serve import RUN_THREADS, WEBHOOK_THREADS, WORKER_TIMEOUT_MS, embedded_workers
from runs.models import Run, RunStatus
from runs.webhooks.models import DeliveryStatus, WebhookDelivery
from tests.support.core import asking_agent, transfer_needing_approval
from tests.support.worker import forget_taken_messages
from tests.support.webhooks import subscribe, wait_settled, wait_until
from tests.support.webhook_receiver import Receiver

STRANGER_SUBSCRIPTIONS = 20
STRANGER_RUNS = 3


@pytest.fixture
def broker(transactional_db):
    """The configured broker, empty before and after the test."""
    broker = dramatiq.get_broker()
    broker.flush_all()
    yield broker
    broker.flush_all()
    forget_taken_messages(broker)


@pytest.fixture
def stranger(transactional_db):
    """A user with no permissions at all: sees only their own runs."""
    return get_user_model().objects.create_user("stranger")


@contextlib.contextmanager
def running(*workers):
    """Start ``workers``; stop them (each finishing the message in hand) on exit."""
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.stop()


def waits(run: Run) -> bool:
    """Whether ``run`` is waiting now (for its approval)."""
    return Run.objects.filter(pk=run.pk, status=RunStatus.WAITING).exists()


def test_a_strangers_endpoints_holding_every_request_take_no_thread_from_another_users_run(
        people, broker, stranger, webhook_settings):
    # The stranger's sends stay held for the whole test: none times out and frees its thread.
    webhook_settings.TOLLGATE = {**webhook_settings.TOLLGATE, "WEBHOOK_TIMEOUT_S": 60.0}
    cap = settings.TOLLGATE["WEBHOOK_MAX_IN_FLIGHT_PER_USER"]
    stuck = Receiver()
    stuck.hold()  # answers nothing until released
    try:
        for _ in range(STRANGER_SUBSCRIPTIONS):
            subscribe(stranger, stuck)
        with running(*embedded_workers(broker)):
            agent = asking_agent("stranger-transfer")
            strangers = [start_run(agent=agent, user=stranger, input="Send 80 to acme.") for _ in range(STRANGER_RUNS)]
            wait_until(lambda: all(waits(run) for run in strangers), 60, "the stranger's runs wait")
            stuck.wait_for(cap)  # their sends are under way, held
            run = transfer_needing_approval(people["requester"], slug="other-separate")
            # The other user's run gets all the way to its approval while the stranger's endpoint holds every
            # request it was sent: the sends hold threads of the webhook worker, none of the run worker.
            wait_until(lambda: waits(run), 30, "the other user's run to wait while the stranger's sends are held")
            assert len(stuck.requests) == cap  # none answered, so no more went out
            stuck.release()

        # Before the change, serve's one worker consumed every queue, runs and webhooks alike: there the
        # stranger's held sends take every thread, and the other user's run goes nowhere until they end.
        assert cap >= RUN_THREADS
        stuck.hold()
        shared = dramatiq.Worker(broker, worker_threads=RUN_THREADS, worker_timeout=WORKER_TIMEOUT_MS)
        sent = len(stuck.requests)
        with running(shared):
            stuck.wait_for(sent + RUN_THREADS)  # the stranger's pending deliveries hold both threads
            run = transfer_needing_approval(people["requester"], slug="other-shared")
            with pytest.raises(AssertionError, match="timed out"):
                wait_until(lambda: waits(run), 3, "the run, held up behind the stranger's sends")
            stuck.release()
            wait_until(lambda: waits(run), 60, "the run once the stranger's sends were answered")
    finally:
        stuck.close()


def test_another_users_deliveries_go_out_while_a_strangers_endpoints_hold_their_in_flight_cap(
        people, broker, stranger, receiver, webhook_settings):
    cap = settings.TOLLGATE["WEBHOOK_MAX_IN_FLIGHT_PER_USER"]
    assert WEBHOOK_THREADS > cap  # serve's default leaves threads for everyone else
    stuck = Receiver()
    stuck.hold()  # answers nothing until released
    try:
        for _ in range(6):
            subscribe(stranger, stuck)
        agent = asking_agent("stranger-transfer")
        with running(*embedded_workers(broker)):
            start_run(agent=agent, user=stranger, input="Send 80 to acme.")
            stuck.wait_for(cap)
            strangers = WebhookDelivery.objects.filter(subscription__owner=stranger)
            wait_until(lambda: strangers.count() > cap, what="more of the stranger's deliveries than the cap")

            mine = subscribe(people["requester"], receiver, "run.waiting")
            run = transfer_needing_approval(people["requester"])
            delivery, = wait_settled(mine, 1)

            # The requester's event went out while the stranger's endpoint held its cap of
            # requests, and no more: their other deliveries, due, wait unsent for a place.
            assert (delivery.status, delivery.run_id) == (DeliveryStatus.DELIVERED, run.pk)
            assert len(stuck.requests) == cap
            waiting = strangers.filter(status=DeliveryStatus.PENDING, attempt_count=0)
            assert waiting.count() == strangers.count() - cap > 0

            # When the endpoint answers, places free up and the rest are sent, never more than `cap` at a time.
            stuck.release()
            wait_until(lambda: not strangers.filter(status=DeliveryStatus.PENDING).exists(), 60,
                       "every delivery of the stranger settled")
    finally:
        stuck.close()
    assert set(strangers.values_list("status", flat=True)) == {DeliveryStatus.DELIVERED}
    assert stuck.most_at_once == cap
