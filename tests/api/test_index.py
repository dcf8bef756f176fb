"""The API's index at /api/ and the site's icon: where an integrator and a browser start."""

from urllib.parse import urlsplit

import pytest
from django.test import Client


@pytest.mark.django_db
def test_the_index_names_every_collection_and_each_link_answers(api, people):
    client = api(people["requester"])
    response = client.get("/api/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body["resources"]) == {"agents", "sessions", "runs", "interrupts", "tools", "events", "webhooks"}
    for name, url in body["resources"].items():
        assert url.startswith("http://testserver/api/"), url
        if name != "events":  # events only take POSTs
            assert client.get(urlsplit(url).path).status_code == 200, name
    assert urlsplit(body["schema"]).path == "/api/schema/"
    assert urlsplit(body["docs"]).path == "/api/docs/"
    assert client.get("/api/schema/").status_code == 200


@pytest.mark.django_db
def test_the_index_asks_a_stranger_to_authenticate():
    response = Client().get("/api/")
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"code", "message", "details"}


@pytest.mark.django_db
def test_the_icon_is_linked_from_every_page_and_served(people):
    client = Client()
    assert 'rel="icon"' in client.get("/accounts/login/").content.decode()
    client.force_login(people["admin"])
    for page in ("/inbox/", "/runs/", "/admin/"):
        assert 'rel="icon"' in client.get(page).content.decode(), page
    redirect = client.get("/favicon.ico")
    assert redirect.status_code == 302  # not permanent: the icon's hashed name changes with it
    icon = client.get(redirect["Location"])
    assert icon.status_code == 200
    assert icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content if icon.streaming else [icon.content])
