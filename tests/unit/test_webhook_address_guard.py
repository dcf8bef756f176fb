"""The address rules of the webhook SSRF guard (``runs.webhooks.urlguard.refusal``), address by address.

Which addresses a webhook may connect to, decided without a database or a
network. Refusing such URLs when saved and when sent is
tests/attack/test_webhooks_ssrf.py and tests/attack/test_webhooks.py.
"""

import ipaddress

import pytest

from runs.webhooks import urlguard


@pytest.mark.parametrize("address, refused", [
    ("8.8.8.8", False), ("2606:4700::1111", False), ("127.0.0.1", True), ("::1", True), ("169.254.1.1", True),
    ("fd00:ec2::254", True), ("100.100.100.200", True), ("10.1.1.1", True), ("::ffff:10.1.1.1", True),
    ("::ffff:8.8.8.8", False), ("2001:0:4136:e378:8000:63bf:80ff:fffe", True),  # Teredo around 127.0.0.1
    ("64:ff9b::a00:1", True), ("64:ff9b::808:808", False),  # NAT64 of 10.0.0.1 and of 8.8.8.8
])
def test_address_rules(address, refused):
    assert (urlguard.refusal(ipaddress.ip_address(address)) is not None) == refused


@pytest.mark.parametrize("address", ["2606:4700::1111", "2a00:1450:4001::200e", "64:ff9b::808:808",
                                     "::ffff:8.8.8.8"])
def test_public_ipv6_and_public_ipv4_inside_ipv6_stay_allowed(address):
    assert urlguard.refusal(ipaddress.ip_address(address)) is None
