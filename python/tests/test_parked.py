"""FerryConnector's polled get: the first miss parks one GET for the key
inside the engine, later polls only reap its queue (pyferry._parked)."""
import threading
import time

import pytest

from pyferry.connector import FerryConnector

from test_connector import stages  # noqa: F401  (fixture)


def submitted(conn):
    return conn.engine().health()["ops"]["submitted"]


def poll_until(c, key, src="0", dst="1", limit=10.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        r = c.get(src, dst, key)
        if r is not None:
            return r
    raise AssertionError(f"{key} did not come in {limit} s")


def test_polls_after_a_miss_submit_nothing(stages):  # noqa: F811
    p, c = stages
    assert c.get("0", "1", "pk_1") is None       # a miss: one nowait GET, then one parked
    assert c.health()["parked_gets"] == 1
    before = submitted(c)
    for _ in range(200):
        assert c.get("0", "1", "pk_1") is None
    assert submitted(c) == before                 # 200 polls, no op through the reactor
    assert p.put("0", "1", "pk_1", b"hello")[0]
    obj, size = poll_until(c, "pk_1")
    assert bytes(obj) == b"hello" and size > 0
    h = c.health()
    assert h["parked_gets"] == 0 and h["arrived_untaken"] == 0 and h["gets"] == 1


def test_data_already_there_comes_at_the_first_poll(stages):  # noqa: F811
    p, c = stages
    assert p.put("0", "1", "pk_here", b"x" * 64)[0]
    obj, _ = c.get("0", "1", "pk_here")
    assert bytes(obj) == b"x" * 64
    assert c.health()["parked_gets"] == 0


def test_get_with_deadline_takes_over_a_parked_key(stages):  # noqa: F811
    p, c = stages
    assert c.get("0", "1", "pk_dl") is None
    assert c.health()["parked_gets"] == 1
    t = threading.Timer(0.2, lambda: p.put("0", "1", "pk_dl", b"late"))
    t.start()
    try:
        r = c.get_with_deadline("0", "1", "pk_dl", deadline=time.monotonic() + 10)
    finally:
        t.join()
    assert r is not None and bytes(r[0]) == b"late"
    assert c.health()["parked_gets"] == 0
    # and one that never comes: None at its deadline, nothing left parked
    assert c.get("0", "1", "pk_dl2") is None
    assert c.get_with_deadline("0", "1", "pk_dl2", deadline=time.monotonic() + 0.2) is None
    assert c.health()["parked_gets"] == 0


def test_cleanup_drops_what_a_parked_get_took(stages):  # noqa: F811
    p, c = stages
    assert c.get("0", "1", "req7_0_1") is None    # parked
    assert p.put("0", "1", "req7_0_1", b"chunk")[0]
    end = time.monotonic() + 5                    # let the parked GET take it (not polled)
    while c.engine().health()["ops"]["gets"] < 1 and time.monotonic() < end:
        time.sleep(0.001)
    c.cleanup("req7")
    h = c.health()
    assert h["arrived_untaken"] == 0 and h["parked_gets"] == 0
    assert c.get("0", "1", "req7_0_1") is None    # gone, not handed out later
    c.cleanup("req7")                             # the poll above parked it again
    assert c.health()["parked_gets"] == 0


def test_close_hands_parked_keys_back_to_a_shared_engine(ns):
    p = FerryConnector({"stage_id": 0, "namespace": ns})
    a = FerryConnector({"stage_id": 1, "namespace": ns})
    b = FerryConnector({"stage_id": 1, "namespace": ns})  # shares a's engine
    try:
        assert a.get("0", "1", "pk_sh") is None
        assert a.health()["parked_gets"] == 1
        a.close()                                 # cancels a's parked GET
        assert p.put("0", "1", "pk_sh", b"for b")[0]
        obj, _ = poll_until(b, "pk_sh")
        assert bytes(obj) == b"for b"
    finally:
        b.close()
        p.close()


def test_parking_is_bounded(stages):  # noqa: F811
    p, c = stages
    for i in range(300):
        assert c.get("0", "1", f"pk_many_{i}") is None
    assert c.health()["parked_gets"] == 256       # past that, polls are nowait GETs
    assert p.put("0", "1", "pk_many_299", b"last")[0]  # one that was not parked
    obj, _ = poll_until(c, "pk_many_299")
    assert bytes(obj) == b"last"
    assert p.put("0", "1", "pk_many_0", b"first")[0]   # one that was
    obj, _ = poll_until(c, "pk_many_0")
    assert bytes(obj) == b"first"


def test_polls_from_threads_each_key_once(stages):  # noqa: F811
    p, c = stages
    n, got, errors = 200, {}, []

    def poller(keys):
        try:
            for k in keys:
                obj, _ = poll_until(c, k)
                got[k] = bytes(obj)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    keys = [f"pk_t_{i}" for i in range(n)]
    ts = [threading.Thread(target=poller, args=(keys[i::2],)) for i in range(2)]
    for t in ts:
        t.start()
    for k in keys:
        assert p.put("0", "1", k, k.encode())[0]
    for t in ts:
        t.join(30)
    assert not errors and got == {k: k.encode() for k in keys}
    h = c.health()
    assert h["parked_gets"] == 0 and h["arrived_untaken"] == 0


def test_parked_get_on_a_closed_connector_raises(stages):  # noqa: F811
    p, c = stages
    assert c.get("0", "1", "pk_cl") is None
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.get("0", "1", "pk_cl")


def test_abandon_get_cancels_the_parked_get(stages):  # noqa: F811
    p, c = stages
    assert c.get("0", "1", "pk_ab") is None
    assert c.health()["parked_gets"] == 1
    c.abandon_get("pk_ab")
    end = time.monotonic() + 5
    while c.health()["parked_gets"] and time.monotonic() < end:  # health reaps
        time.sleep(0.001)
    assert c.health()["parked_gets"] == 0
    assert p.put("0", "1", "pk_ab", b"kept")[0]   # stays in the engine: a later get has it
    r = c.get_with_deadline("0", "1", "pk_ab", deadline=time.monotonic() + 5)
    assert r is not None and bytes(r[0]) == b"kept"


def test_park_gets_false_polls_with_nowait_gets(ns):  # noqa: F811
    """park_gets: false: each poll is one nowait GET through the engine, none parks."""
    p = FerryConnector({"stage_id": 0, "namespace": ns, "pool_size": 32 << 20})
    c = FerryConnector({"stage_id": 1, "namespace": ns, "pool_size": 32 << 20,
                        "park_gets": False})
    try:
        assert c.get("0", "1", "np_1") is None
        before = submitted(c)
        for _ in range(50):
            assert c.get("0", "1", "np_1") is None
        assert submitted(c) - before == 50            # one op per poll
        assert c.health()["parked_gets"] == 0
        assert p.put("0", "1", "np_1", b"hi")[0]
        obj, size = poll_until(c, "np_1")
        assert bytes(obj) == b"hi" and size > 0
    finally:
        c.close()
        p.close()


@pytest.mark.parametrize("bad", ["no", 0, None])
def test_park_gets_must_be_a_bool(ns, bad):  # noqa: F811
    with pytest.raises(TypeError, match="park_gets"):
        FerryConnector({"stage_id": 1, "namespace": ns, "park_gets": bad})
