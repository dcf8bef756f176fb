"""Live updates: the run WebSocket consumers and the loop-safe in-memory layer."""

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser

from runs.base.channel_layers import LoopSafeInMemoryChannelLayer
from runs.live import publish_run_update
from runs.web.routing import websocket_urlpatterns
from runs.engine.lifecycle import start_run
from tests.support.core import asking_agent

pytestmark = pytest.mark.django_db(transaction=True)


def _communicator(path: str, user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    return communicator


async def _connected(run, user) -> tuple[WebsocketCommunicator, dict]:
    """A socket of ``run`` for ``user``, connected, and the first message it sent (its snapshot)."""
    communicator = _communicator(f"/ws/runs/{run.pk}/", user)
    assert (await communicator.connect(timeout=5))[0]
    return communicator, await communicator.receive_json_from(timeout=5)


@pytest.fixture
def run(people):
    return start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme")


def test_run_socket_sends_snapshot_then_updates_to_the_requester(run, people):
    @async_to_sync
    async def scenario():
        communicator = _communicator(f"/ws/runs/{run.pk}/", people["requester"])
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        first = await communicator.receive_json_from(timeout=5)
        assert first == {"type": "run.update", "run": {**first["run"], "id": run.pk, "status": "queued"}}
        from channels.db import database_sync_to_async

        await database_sync_to_async(publish_run_update)(run.pk)
        update = await communicator.receive_json_from(timeout=5)
        assert update["type"] == "run.update" and update["run"]["id"] == run.pk
        await communicator.disconnect()

    scenario()


def test_run_socket_refuses_anonymous_and_other_users(run, people):
    stranger = get_user_model().objects.create_user("stranger", password="x")

    @async_to_sync
    async def scenario():
        for user in [AnonymousUser(), stranger]:
            communicator = _communicator(f"/ws/runs/{run.pk}/", user)
            connected, _ = await communicator.connect(timeout=5)
            assert not connected
        approver = _communicator(f"/ws/runs/{run.pk}/", people["approver"])  # deciders see every run
        connected, _ = await approver.connect(timeout=5)
        assert connected
        await approver.disconnect()

    scenario()


def test_a_change_made_while_the_run_socket_reads_its_snapshot_is_pushed_to_it(run, people, monkeypatch):
    """The socket joins the run's group before it reads the snapshot: a change committed (and published) just
    after the read still reaches it. Had it joined after the read, that push would have gone to nobody."""
    from runs import live
    from runs.models import Run
    from runs.web import consumers

    read = consumers._visible_snapshot

    async def read_then_change(user, run_id):
        snapshot = await read(user, run_id)

        def change():
            Run.objects.filter(pk=run_id).update(phase="model", last_event_seq=snapshot["seq"] + 1)
            publish_run_update(run_id)
            live.flush()

        from channels.db import database_sync_to_async

        await database_sync_to_async(change)()
        return snapshot

    monkeypatch.setattr(consumers, "_visible_snapshot", read_then_change)

    @async_to_sync
    async def scenario():
        communicator, first = await _connected(run, people["requester"])
        pushed = await communicator.receive_json_from(timeout=5)
        assert first["run"]["phase"] != "model"
        assert pushed["run"]["phase"] == "model" and pushed["run"]["seq"] == first["run"]["seq"] + 1
        await communicator.disconnect()

    scenario()


def test_a_refused_run_socket_leaves_every_group_it_joined_and_handles_nothing_pushed_meanwhile(
        run, people, monkeypatch):
    """A user who may not see the run is refused: the groups the socket joined before the check are left again,
    each once, and a change pushed to them while it read is dropped (no second close, no query for it)."""
    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer

    from runs import live
    from runs.web import consumers

    stranger = get_user_model().objects.create_user("stranger", password="x")
    layer = get_channel_layer()
    joined, left = [], []
    add, discard = layer.group_add, layer.group_discard

    async def recording_add(group, channel):
        joined.append(group)
        await add(group, channel)

    async def recording_discard(group, channel):
        left.append(group)
        await discard(group, channel)

    read = consumers._visible_snapshot

    async def read_while_it_changes(user, run_id):
        def push():
            publish_run_update(run_id)
            live.flush()

        await database_sync_to_async(push)()
        await asyncio.sleep(0.2)  # the push reaches the socket's channel before the refusal
        return await read(user, run_id)

    monkeypatch.setattr(layer, "group_add", recording_add)
    monkeypatch.setattr(layer, "group_discard", recording_discard)
    monkeypatch.setattr(consumers, "_visible_snapshot", read_while_it_changes)

    @async_to_sync
    async def scenario():
        communicator = _communicator(f"/ws/runs/{run.pk}/", stranger)
        connected, code = await communicator.connect(timeout=5)
        assert not connected
        await communicator.wait(timeout=2)  # the consumer stopped: nothing more comes out of it
        assert communicator.future.done() and communicator.output_queue.empty()

    scenario()
    assert f"run-{run.pk}" in joined
    assert sorted(left) == sorted(joined)


def test_a_snapshot_published_before_the_first_one_was_read_is_not_sent_after_it(run, people, monkeypatch):
    """A push that reached the socket's group before it read its first snapshot, but is handled after it,
    carries an older ``seq``: it is dropped, so the socket never goes back in time."""
    from channels.db import database_sync_to_async

    from runs import live
    from runs.models import Run
    from runs.web import consumers

    read = consumers._visible_snapshot

    async def pushed_then_changed_then_read(user, run_id):
        def push_then_change():
            publish_run_update(run_id)  # the snapshot as it is now
            live.flush()
            Run.objects.filter(pk=run_id).update(last_event_seq=Run.objects.get(pk=run_id).last_event_seq + 1)

        await database_sync_to_async(push_then_change)()
        await asyncio.sleep(0.2)
        return await read(user, run_id)

    monkeypatch.setattr(consumers, "_visible_snapshot", pushed_then_changed_then_read)

    @async_to_sync
    async def scenario():
        communicator, first = await _connected(run, people["requester"])
        assert first["run"]["seq"] == run.last_event_seq + 1
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()

    scenario()


def test_run_list_socket_forwards_only_visible_runs(run, people):
    stranger = get_user_model().objects.create_user("stranger", password="x")

    @async_to_sync
    async def scenario():
        from channels.db import database_sync_to_async

        theirs = _communicator("/ws/runs/", stranger)
        deciders = _communicator("/ws/runs/", people["approver"])
        assert (await theirs.connect(timeout=5))[0] and (await deciders.connect(timeout=5))[0]
        await database_sync_to_async(publish_run_update)(run.pk)
        assert (await deciders.receive_json_from(timeout=5))["run"]["id"] == run.pk
        assert await theirs.receive_nothing(timeout=0.3)
        await theirs.disconnect()
        await deciders.disconnect()

    scenario()


def test_forwarding_a_message_takes_no_turn_in_the_sync_thread(run, people, monkeypatch):
    """A message forwarded to a socket costs no hop into the thread Django's views share: Channels'
    own dispatch swept stale database connections there before every message of every socket."""
    import channels.consumer

    sweeps = []
    sweep = channels.consumer.aclose_old_connections

    async def counted():
        sweeps.append(1)
        await sweep()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)

    @async_to_sync
    async def scenario():
        from channels.db import database_sync_to_async

        sockets = [_communicator("/ws/runs/", people["approver"]) for _ in range(3)]
        for socket in sockets:
            assert (await socket.connect(timeout=5))[0]
        for _ in range(4):
            await database_sync_to_async(publish_run_update)(run.pk)
        for socket in sockets:
            for _ in range(4):
                assert (await socket.receive_json_from(timeout=5))["run"]["id"] == run.pk
        for socket in sockets:
            await socket.disconnect()
        assert sweeps == []  # 3 connects, 12 forwarded messages, 3 disconnects: Channels' dispatch swept 18 times

    scenario()


def _cross_thread_latency(layer) -> float | None:
    """Seconds from a publish in this thread to its receipt in another thread's loop (None: not within 2 s)."""
    received = {}
    ready = threading.Event()

    async def receiver():
        channel = await layer.new_channel()
        await layer.group_add("g", channel)
        ready.set()
        try:
            await asyncio.wait_for(layer.receive(channel), 2)
            received["at"] = time.monotonic()
        except asyncio.TimeoutError:
            pass

    thread = threading.Thread(target=lambda: asyncio.run(receiver()))
    thread.start()
    ready.wait(5)
    time.sleep(0.1)
    sent_at = time.monotonic()
    async_to_sync(layer.group_send)("g", {"type": "run.update"})
    thread.join()
    return received["at"] - sent_at if "at" in received and received["at"] - sent_at < 1.9 else None


def test_loop_safe_layer_delivers_a_publish_from_a_worker_thread_at_once():
    # The stock layer's receiver only notices a message from another
    # thread's loop when its own loop wakes up for another reason.
    assert _cross_thread_latency(LoopSafeInMemoryChannelLayer()) < 0.5
    assert isinstance(LoopSafeInMemoryChannelLayer(), InMemoryChannelLayer)


class _GatedLayer(LoopSafeInMemoryChannelLayer):
    """The in-memory layer, but ``group_send`` holds until ``gate`` is set (Redis slow or unreachable)."""

    def __init__(self, fail_groups=()):
        super().__init__()
        self.gate = threading.Event()
        self.fail_groups = set(fail_groups)
        self.sent: list[str] = []

    async def group_send(self, group, message):
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        if group in self.fail_groups:
            raise ConnectionError("layer refused")
        self.sent.append(group)
        await super().group_send(group, message)


def _listening(layer, *groups) -> str:
    channel = async_to_sync(layer.new_channel)()
    for group in groups:
        async_to_sync(layer.group_add)(group, channel)
    return channel


def test_publishing_does_not_wait_for_the_layer_and_keeps_the_order(monkeypatch):
    from runs import live

    layer = _GatedLayer()
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    channel = _listening(layer, live.user_group(7), live.run_group(5))
    started = time.monotonic()
    live.publish_access_changed([7])
    live.publish_delta(5, kind="text_delta", data={"text": "a"})
    live.publish_delta(5, kind="text_delta", data={"text": "b"})
    assert time.monotonic() - started < 1.0  # returned while the layer could send nothing
    assert layer.sent == []
    layer.gate.set()
    live._sender.flush(timeout_s=5)
    received = [async_to_sync(layer.receive)(channel) for _ in range(3)]
    assert [(m["type"], m.get("data")) for m in received] == [
        ("access.changed", None), ("run.delta", {"text": "a"}), ("run.delta", {"text": "b"})]


def test_a_send_the_layer_refuses_is_logged_and_the_next_ones_still_go(monkeypatch, caplog):
    from runs import live

    layer = _GatedLayer(fail_groups={live.run_group(6)})
    layer.gate.set()
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    channel = _listening(layer, live.run_group(5))
    live.publish_delta(6, kind="text_delta", data={"text": "lost"})
    live.publish_delta(5, kind="text_delta", data={"text": "kept"})
    live._sender.flush(timeout_s=5)
    assert async_to_sync(layer.receive)(channel)["data"] == {"text": "kept"}
    assert "could not publish run.delta" in caplog.text


def test_a_full_backlog_drops_its_oldest_batch_and_keeps_the_newest(monkeypatch, caplog):
    from runs import live

    monkeypatch.setattr(live, "MAX_BACKLOG", 2)
    sender, layer = live._Sender(), _GatedLayer()
    channel = _listening(layer, live.run_group(5))
    for text in ("first", "second", "third", "fourth"):  # "first" is out (held by the layer); 2 fit behind it
        sender.send(layer, [(live.run_group(5), {"type": "run.delta", "kind": "text_delta", "data": {"text": text}})])
        time.sleep(0.05)
    layer.gate.set()
    sender.flush(timeout_s=5)
    received = [async_to_sync(layer.receive)(channel)["data"]["text"] for _ in range(3)]
    assert received == ["first", "third", "fourth"]
    assert "backlog full (2); dropped a run.delta" in caplog.text


def test_snapshots_queued_behind_a_slow_layer_go_out_once_each_with_the_highest_seq_in_place(monkeypatch):
    """While the layer holds the first send, a run's later snapshots and event notices pile up: only the last of
    each goes out, where it was handed over (after an ``access.changed`` handed over before it), with the
    highest ``seq``; deltas all go out."""
    from runs import live

    sender, layer = live._Sender(), _GatedLayer()
    channel = _listening(layer, live.run_group(5), live.run_group(6), live.user_group(7),
                         live.run_events_group(5))

    def update(run_id, seq):
        return (live.run_group(run_id), {"type": "run.update", "run": {"id": run_id, "seq": seq}})

    sender.send(layer, [update(5, 1)])  # taken at once, held by the layer
    time.sleep(0.05)
    sender.send(layer, [update(5, 3), update(6, 1), (live.run_events_group(5), {"type": "run.event", "seq": 4})])
    sender.send(layer, [(live.user_group(7), {"type": "access.changed", "ended_session": ""})])
    sender.send(layer, [update(5, 2), (live.run_group(5), {"type": "run.delta", "kind": "text_delta", "data": {}})])
    sender.send(layer, [(live.run_events_group(5), {"type": "run.event", "seq": 5})])
    layer.gate.set()
    sender.flush(timeout_s=5)
    assert len(layer.sent) == 6  # the superseded three never reached the layer
    received = [async_to_sync(layer.receive)(channel) for _ in range(6)]
    assert [(m["type"], m.get("run", {}).get("id"), m.get("run", {}).get("seq", m.get("seq"))) for m in received] == [
        ("run.update", 5, 1), ("run.update", 6, 1), ("access.changed", None, None), ("run.update", 5, 3),
        ("run.delta", None, None), ("run.event", None, 5)]


def test_a_one_pass_sweep_sends_its_pushes_before_the_command_returns(people, monkeypatch):
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone

    from approvals.models import Interrupt
    from runs import live
    from runs.engine import loop

    class SlowLayer(_GatedLayer):
        async def group_send(self, group, message):
            await asyncio.sleep(0.3)  # Redis far away: the command returns long before this is sent
            await super().group_send(group, message)

    run = start_run(agent=asking_agent(), user=people["requester"], input="Send 80 to acme")
    loop.advance(run.pk)
    Interrupt.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    layer = SlowLayer()
    layer.gate.set()
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    call_command("recover_runs", stdout=open("/dev/null", "w"))
    run.refresh_from_db()
    assert run.status == "failed"  # the sweep expired the approval and ended the run
    assert live.run_group(run.pk) in layer.sent


def test_a_token_by_token_stream_is_pushed_in_few_pieces_that_add_up_to_it(monkeypatch):
    """``DeltaBuffer``: a stream's fragments within ``DELTA_INTERVAL_S`` of each other go out as one push per kind
    and call; what the pushes carry, joined, is exactly what was streamed."""
    from runs import live

    pushed = []
    clock = [100.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    buffer = live.DeltaBuffer(5, push=lambda run_id, *, kind, data: pushed.append((run_id, kind, dict(data))))
    text = "Order 123 can be refunded."
    buffer.add("text_delta", {"text": text[0]})  # the first fragment goes out at once
    for char in text[1:]:
        clock[0] += 0.001
        buffer.add("text_delta", {"text": char})
    buffer.add("tool_call_delta", {"index": 0, "id": "c1", "name": "refund", "arguments": '{"order_id"'})
    buffer.add("tool_call_delta", {"index": 0, "id": "c1", "name": "refund", "arguments": ': 123}'})
    clock[0] += live.DELTA_INTERVAL_S  # the next fragment comes a push interval later: it and all before it go
    buffer.add("tool_call_delta", {"index": 1, "id": "c2", "name": "query_order", "arguments": "{}"})
    buffer.flush()  # nothing left: nothing pushed

    assert len(pushed) == 4  # "O" at once, then the rest of the text and each call's fragments joined
    assert {run_id for run_id, _, _ in pushed} == {5}
    assert "".join(d["text"] for _, kind, d in pushed if kind == "text_delta") == text
    calls = [d for _, kind, d in pushed if kind == "tool_call_delta"]
    assert calls == [{"index": 0, "id": "c1", "name": "refund", "arguments": '{"order_id": 123}'},
                     {"index": 1, "id": "c2", "name": "query_order", "arguments": "{}"}]


def test_list_snapshots_queued_together_go_out_as_one_message_in_place_of_the_last(monkeypatch):
    """What the sender finds queued for the run list's group goes there as one ``"runs.update"`` message
    carrying every snapshot, at most ``MAX_FOLDED`` each, where the last was handed over; each run's own group
    still gets its snapshot, and a lone list snapshot stays a ``run.update``."""
    from runs import live

    monkeypatch.setattr(live, "MAX_FOLDED", 2)
    sender, layer = live._Sender(), _GatedLayer()
    listing = _listening(layer, live.RUNS_GROUP)
    own = _listening(layer, live.run_group(6))

    def update(run_id, seq):
        message = {"type": "run.update", "run": {"id": run_id, "seq": seq}}
        return [(live.run_group(run_id), message), (live.RUNS_GROUP, message)]

    sender.send(layer, update(5, 1))  # taken at once, held by the layer
    time.sleep(0.05)
    sender.send(layer, update(6, 1) + update(7, 1))
    sender.send(layer, [(live.user_group(9), {"type": "access.changed", "ended_session": ""})])
    sender.send(layer, update(8, 1))
    layer.gate.set()
    sender.flush(timeout_s=5)
    received = [async_to_sync(layer.receive)(listing) for _ in range(3)]
    assert [(m["type"], m.get("run", {}).get("id"), [r["id"] for r in m.get("runs", [])]) for m in received] == [
        ("run.update", 5, []), ("runs.update", None, [6, 7]), ("run.update", 8, [])]  # 8 alone once 2 were full
    assert async_to_sync(layer.receive)(own)["run"]["id"] == 6
    assert layer.sent.count(live.RUNS_GROUP) == 3
    assert [group for group in layer.sent if group != live.RUNS_GROUP] == [
        live.run_group(5), live.run_group(6), live.run_group(7), live.user_group(9), live.run_group(8)]


def test_the_list_socket_forwards_each_visible_snapshot_of_a_folded_message(run, people):
    from runs import live

    stranger = get_user_model().objects.create_user("stranger", password="x")
    theirs = start_run(agent=asking_agent(), user=stranger, input="mine")

    @async_to_sync
    async def scenario():
        from channels.db import database_sync_to_async
        from channels.layers import get_channel_layer

        socket = _communicator("/ws/runs/", stranger)
        assert (await socket.connect(timeout=5))[0]
        snapshots = await database_sync_to_async(
            lambda: [live.run_snapshot(r) for r in (type(run).objects.get(pk=pk) for pk in (run.pk, theirs.pk))])()
        await get_channel_layer().group_send(live.RUNS_GROUP, {"type": "runs.update", "runs": snapshots})
        got = await socket.receive_json_from(timeout=5)
        assert (got["type"], got["run"]["id"]) == ("run.update", theirs.pk)  # the requester's run is not theirs
        assert await socket.receive_nothing(timeout=0.3)
        await socket.disconnect()

    scenario()
