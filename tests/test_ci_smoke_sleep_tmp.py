import time
def test_sleep():
    time.sleep(60)
