"""The demo shop in the admin in the browser's language (issue 12): its model on the index and its order list.

The rest of the admin's words are tests/web/test_admin_i18n.py (without the demo).
"""

import pytest

from tests.web.test_admin import changelist_url
from tests.web.test_admin_i18n import check, language, page_text  # noqa: F401 (a fixture)
from tools.demo.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_in(client, demo, language):
    """The demo superuser's client (the demo's orders loaded), every request sent with ``Accept-Language``."""
    client.force_login(demo["admin"])
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = language
    return client


def test_index_names_the_shops_orders(admin_in, language):
    check(page_text(admin_in.get("/admin/")), {"zh-hans": [">订单<"], "en": [">Orders<"]}, language)


def test_demo_shop_list(admin_in, language):
    check(page_text(admin_in.get(changelist_url(Order))), {
        "zh-hans": [">编号</a>", ">总额</a>", ">已发货</a>", "以 已发货", ">未结<"],
        "en": [">Number</a>", ">Total</a>", ">Shipped</a>", "By shipped", ">open<"],
    }, language)
