# TEMPORARY: proves tests/run.sh's services work. Delete me.
import os

import pytest


@pytest.mark.skipif(not os.environ.get("DATABASE_URL"), reason="no DATABASE_URL")
def test_postgres():
    import psycopg
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        assert conn.execute("select current_user, current_database()").fetchone() == ("tollgate", "tollgate")
        assert conn.execute("show fsync").fetchone() == ("off",)


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="no REDIS_URL")
def test_redis():
    import redis
    assert redis.Redis.from_url(os.environ["REDIS_URL"]).ping()


def test_chromium_env():
    assert os.environ["TOLLGATE_CHROMIUM"] == "/usr/bin/chromium"


def test_env_shape():
    print("ENV", os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL"))


@pytest.mark.browser
def test_browser_marker_only_in_pg_run():
    assert os.environ.get("DATABASE_URL")
