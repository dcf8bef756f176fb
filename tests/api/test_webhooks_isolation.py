"""A user's slow webhook endpoints take no capacity from runs, nor from other users' deliveries (issue 26).

Real parts throughout: the workers ``manage.py serve`` starts
(``embedded_workers``: one for the run queues, one for ``webhooks``), real
HTTP endpoints on loopback (``tests.support.webhook_receiver.Receiver``), runs
started and advanced as in production. A stranger (no permissions) points
many subscriptions at an endpoint that answers slowly, or not at all.
"""

import contextlib
import statistics

import dramatiq
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from runs.engine.lifecycle import start_run
from runs.management.commands.serve import RUN_THREADS, WEBHOOK_THREADS, WORKER_TIMEOUT_MS, embedded_workers
from runs.models import Run, RunEvent, RunStatus
from runs.webhooks.models import DeliveryStatus, WebhookDelivery
from tests.support.core import asking_agent, transfer_needing_approval
from tests.support.worker import forget_taken_messages
from tests.support.webhooks import subscribe, wait_settled, wait_until
from tests.support.webhook_receiver import Receiver

SLOW_ENDPOINT_S = 2.0
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


def created_to_waiting_s(run: Run) -> float:
    """Seconds from the run's creation to its first transition to ``waiting`` (both stored times)."""
    waited = RunEvent.objects.filter(run=run, type="transition", to_status="waiting").order_by("seq").first()
    return (waited.created_at - run.created_at).total_seconds()


def others_run_time(broker, workers, people, *, stranger=None, slow: Receiver | None = None,
                    samples: int = 1) -> float:
    """Created → waiting of the requester's transfer run (the median of ``samples`` runs, one after another).

    ``workers`` consume the broker meanwhile. With a ``stranger``, they
    start ``STRANGER_RUNS`` runs first, and the requester's runs start once
    those stopped running and the slow endpoint is receiving their
    deliveries (two requests arrived: webhook sending is under way).
    """
    broker.flush_all()
    times = []
    with running(*workers):
        if stranger is not None:
            arrived = len(slow.requests)
            agent = asking_agent(f"stranger-{arrived}")
            runs = [start_run(agent=agent, user=stranger, input="Send 80 to acme.") for _ in range(STRANGER_RUNS)]
            wait_until(lambda: not Run.objects.filter(pk__in=[r.pk for r in runs], status__in=[
                RunStatus.QUEUED, RunStatus.RUNNING]).exists(), 60, "the stranger's runs stopped running")
            slow.wait_for(arrived + 2)
        for _ in range(samples):
            run = transfer_needing_approval(people["requester"], slug=f"other-{Run.objects.count()}")
            wait_until(lambda: Run.objects.filter(pk=run.pk, status=RunStatus.WAITING).exists(), 60, "the run waits")
            times.append(created_to_waiting_s(Run.objects.get(pk=run.pk)))
    return statistics.median(times)


def test_a_strangers_slow_endpoints_do_not_slow_another_users_run_with_the_workers_serve_starts(
        people, broker, stranger, webhook_settings):
    slow = Receiver(delay_s=SLOW_ENDPOINT_S)
    try:
        alone = others_run_time(broker, embedded_workers(broker), people, samples=3)

        for _ in range(STRANGER_SUBSCRIPTIONS):
            subscribe(stranger, slow)
        separate = others_run_time(broker, embedded_workers(broker), people, stranger=stranger, slow=slow, samples=3)
        # Before the change: serve's one worker consumed every queue, runs and webhooks alike.
        shared = others_run_time(broker, [dramatiq.Worker(broker, worker_threads=RUN_THREADS,
                                                          worker_timeout=WORKER_TIMEOUT_MS)],
                                 people, stranger=stranger, slow=slow)
    finally:
        slow.close()

    print(f"created -> waiting (median of 3; 1 on the shared worker): alone {alone:.3f} s, stranger's webhooks on their own worker {separate:.3f} s, "
          f"on the run worker {shared:.3f} s")
    # The stranger's sends were under way both times (their endpoint got requests)...
    assert len(slow.requests) >= 4
    # ...yet with separate workers the other user's run is about as fast as with no webhooks at all (the
    # factor is generous: here the stranger's sends and polls share the process, its GIL and SQLite's lock),
    assert separate < 5 * alone
    # while sharing the run worker's threads it waited for the stranger's slow sends.
    assert shared > 3 * separate and shared > 3 * alone


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
