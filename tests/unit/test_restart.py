from slotkeeper.core.server.restart import RestartPolicy


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_grows_and_limit_stops_restarts():
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=3, window_seconds=600, backoff_base=1, backoff_max=30, clock=clock)
    delays = []
    for _ in range(3):
        d = policy.on_crash()
        assert d.restart
        delays.append(d.delay_seconds)
        clock.now += 5
    assert delays == [1, 2, 4]
    final = policy.on_crash()
    assert not final.restart
    assert "4 times within 10 minutes" in final.reason


def test_old_crashes_leave_the_window():
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=2, window_seconds=60, clock=clock)
    assert policy.on_crash().restart
    assert policy.on_crash().restart
    assert not policy.on_crash().restart
    clock.now += 61
    decision = policy.on_crash()
    assert decision.restart and decision.delay_seconds == 1  # the first of a new window again


def test_backoff_is_capped_and_reset_clears():
    clock = FakeClock()
    policy = RestartPolicy(max_restarts=10, backoff_base=4, backoff_max=10, clock=clock)
    delays = [policy.on_crash().delay_seconds for _ in range(4)]
    assert delays == [4, 8, 10, 10]
    policy.reset()
    assert policy.on_crash().delay_seconds == 4  # counted from the first again
