"""python -m bench.functions: one decision through FCALL (a Functions library) against EVALSHA (one
assembled script), per strategy, in one run: the server's time per call (INFO commandstats) and the
client's p50. Uses REDIS_URL, or a private server of its own when unset.

The modes alternate in rounds, so a change in the machine's load weighs on both alike.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

ROUNDS = 10
PER_ROUND = 2000
MODES = {"EVALSHA": False, "FCALL": "auto"}
COMMAND = {"EVALSHA": "cmdstat_evalsha", "FCALL": "cmdstat_fcall"}


def server_usec(client, command: str) -> tuple[int, int]:
    stats = client.info("commandstats").get(command, {})
    return stats.get("calls", 0), stats.get("usec", 0)


def measure(strategy: str) -> dict[str, tuple[float, float]]:
    from django.test import override_settings

    from bench.common import decider, policy, server, subject

    decision = decider([policy(strategy)], subject("192.0.2.9"))  # a limit never reached: admits and counts
    latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
    usec = {mode: [0, 0] for mode in MODES}
    clock = time.perf_counter
    for round_number in range(ROUNDS):
        order = list(MODES.items())[:: -1 if round_number % 2 else 1]
        for mode, setting in order:
            with override_settings(RATELIMIT_REDIS_FUNCTIONS=setting):
                for _ in range(100):  # warm: loaded, connected
                    decision()
                calls_before, usec_before = server_usec(server(), COMMAND[mode])
                samples = latencies[mode]
                for _ in range(PER_ROUND):
                    started = clock()
                    decision()
                    samples.append(clock() - started)
                calls_after, usec_after = server_usec(server(), COMMAND[mode])
                usec[mode][0] += calls_after - calls_before
                usec[mode][1] += usec_after - usec_before
    return {mode: (usec[mode][1] / usec[mode][0], statistics.median(latencies[mode]) * 1e6) for mode in MODES}


def main() -> None:
    private = None
    if not os.environ.get("REDIS_URL"):
        from project.devredis import PrivateRedis

        private = PrivateRedis().start()
        os.environ["REDIS_URL"] = private.url
    try:
        from bench.__main__ import WORK, configure

        configure(WORK)  # Django set up on REDIS_URL
        from bench.common import server

        print(server().info("server")["redis_version"], f"{ROUNDS} x {PER_ROUND} decisions per mode and strategy")
        print(f"{'strategy':16} {'mode':8} {'server us/call':>15} {'client p50 us':>14}")
        for strategy in ("fixed_window", "sliding_window"):
            for mode, (server_time, client_p50) in measure(strategy).items():
                print(f"{strategy:16} {mode:8} {server_time:15.2f} {client_p50:14.1f}")
    finally:
        if private:
            private.stop()


if __name__ == "__main__":
    sys.exit(main())
