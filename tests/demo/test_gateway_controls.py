"""The demo payment gateway's test controls (reset, faults) answer on loopback only (an attack test of the demo)."""

from tools.demo.gateway_server import GatewayHandler, Ledger


def test_gateway_test_controls_answer_on_loopback_only(tmp_path):
    ledger = Ledger(str(tmp_path / "ledger.sqlite3"))
    ledger.charge("key-1", 123, 10)
    handler_class = type("Handler", (GatewayHandler,), {"ledger": ledger, "faults": {}})
    for address, path, expected in ((("192.0.2.7", 40000), "/reset", 403), (("192.0.2.7", 40000), "/faults", 403),
                                    (("127.0.0.1", 40000), "/reset", 200)):
        handler = object.__new__(handler_class)  # no socket: the routing alone
        handler.client_address, handler.path, handler.headers = address, path, {}
        sent = []
        handler._send = lambda status, body, sent=sent: sent.append(status)
        handler.do_POST()
        assert sent == [expected], (address, path)
        if expected == 403:
            assert ledger.find("key-1") is not None
    assert ledger.find("key-1") is None

