"""The circuit breaker as a state machine, on real connections: closed -> open after an outage ->
half-open after RATELIMIT_BREAKER_SECONDS (one probe) -> closed on an answer, open again on a failure.
An error Redis answers with is no outage."""

from __future__ import annotations

import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimit_app.engine.circuit import CircuitBreaker, RedisCommandError, RedisUnavailable

# nothing listens on port 1: refused at once (redis-py's default retries would wait seconds first)
DEAD = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))


@pytest.fixture
def circuit(settings):
    settings.RATELIMIT_BREAKER_SECONDS = 0.2
    found = CircuitBreaker()
    found.reconnections = []
    found.reconnect = found.reconnections.append
    return found


def open_circuit(circuit: CircuitBreaker) -> None:
    with pytest.raises(RedisUnavailable, match="Connection refused"):
        circuit.call(DEAD.ping)


def wait_half_open(circuit: CircuitBreaker) -> None:
    threading.Event().wait(0.25)  # RATELIMIT_BREAKER_SECONDS of the fixture, and a little more


def test_a_closed_circuit_passes_calls_and_their_answers(circuit, redis_client):
    assert circuit.call(redis_client.ping) is True
    assert (circuit.open_until, circuit.failures) == (0.0, 0)


def test_an_outage_opens_the_circuit_and_calls_fail_at_once_without_reaching_redis(circuit, redis_client):
    open_circuit(circuit)
    assert circuit.failures == 1 and len(circuit.reconnections) == 1  # connections are taken anew
    reached = []
    with pytest.raises(RedisUnavailable, match="Connection refused"):  # the cause, named by the fast failure
        circuit.call(lambda: reached.append(redis_client.ping()))
    assert reached == [] and circuit.failures == 1


def test_after_the_interval_one_probe_closes_the_circuit(circuit, redis_client):
    open_circuit(circuit)
    wait_half_open(circuit)
    assert circuit.call(redis_client.ping) is True
    assert circuit.open_until == 0.0
    assert circuit.call(redis_client.ping) is True


def test_a_failed_probe_opens_the_circuit_again(circuit, redis_client):
    open_circuit(circuit)
    wait_half_open(circuit)
    open_circuit(circuit)
    assert circuit.failures == 2
    with pytest.raises(RedisUnavailable):
        circuit.call(redis_client.ping)  # open again: the working server is not asked


def test_while_the_probe_waits_for_its_answer_other_calls_fail_fast(circuit, redis_client):
    open_circuit(circuit)
    wait_half_open(circuit)
    probing, release = threading.Event(), threading.Event()

    def slow_probe():
        probing.set()
        release.wait(5)
        return redis_client.ping()

    prober = threading.Thread(target=circuit.call, args=(slow_probe,))
    prober.start()
    probing.wait(5)
    with pytest.raises(RedisUnavailable):
        circuit.call(redis_client.ping)
    release.set()
    prober.join()
    assert circuit.open_until == 0.0


def test_an_error_redis_answers_with_leaves_the_circuit_closed(circuit, redis_client):
    redis_client.set("not-a-list", "x")
    with pytest.raises(RedisCommandError, match="WRONGTYPE"):
        circuit.call(lambda: redis_client.lpush("not-a-list", 1))
    assert (circuit.open_until, circuit.failures, circuit.errors) == (0.0, 0, 1)
    assert circuit.call(redis_client.ping) is True
