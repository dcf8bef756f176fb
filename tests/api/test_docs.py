"""Issue 11, item 5: the API docs page at ``/api/docs/``: Swagger UI served from this site under its CSP.

The real-browser check (the page renders every operation, no CSP
violation, no request to another host) is in test_browser.py.
"""

import re

ASSET = re.compile(r'<(?:script|link)\b[^>]*?(?:src|href)="([^"]+)"')


def _body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_docs_page_sends_people_who_are_not_logged_in_to_the_login_page(client, people):
    response = client.get("/api/docs/")

    assert response.status_code == 302 and response["Location"] == "/accounts/login/?next=/api/docs/"


def test_docs_page_and_every_asset_are_served_by_this_site_under_its_csp(client, people):
    client.force_login(people["requester"])

    response = client.get("/api/docs/")

    assert response.status_code == 200
    html = response.content.decode()
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
    assert "<style" not in html and "style=" not in html
    assert re.findall(r"<script>", html) == [], "no inline script"
    assets = ASSET.findall(html)
    assert len(assets) >= 5  # favicon, two stylesheets, bundle, preset, start-up script
    for url in assets:
        assert url.startswith("/"), f"{url} is not served by this site"
        asset = client.get(url.replace("&amp;", "&"))
        assert asset.status_code == 200, url
        assert len(_body(asset)) > 0, url
    assert any("swagger-ui-bundle.js" in url for url in assets)


def test_the_start_up_script_points_swagger_ui_at_this_schema(client, people):
    client.force_login(people["requester"])

    script = client.get("/api/docs/?script=")

    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")
    assert '"/api/schema/"' in script.content.decode()
