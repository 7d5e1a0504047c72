"""Where the endpoint pool sends a conversation's turns (engine/client/pool.py `pick` with a key): to the server
of its last answer while that server is under the load cap; by rendezvous hash otherwise."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from datagen_operator.engine.client.pool import LOAD_CAP, Endpoint, EndpointPool, rendezvous

URLS = [f"http://server-{index}:30000" for index in range(4)]
Key = tuple[str, int]


def with_pool(scenario: Callable[[Callable[[], EndpointPool]], None]) -> None:
    async def run() -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            scenario(lambda: EndpointPool(URLS, session, unreachable_after_s=1))

    asyncio.run(run())


def ranks_first(key: Key) -> str:
    return max(URLS, key=lambda url: rendezvous(key, url))


def turn(pool: EndpointPool, keys: list[Key]) -> dict[Key, Endpoint]:
    """One turn of every conversation, all in flight together (as lanes hold them), then answered."""
    placed: dict[Key, Endpoint] = {}
    for key in keys:
        endpoint = pool.pick(key)
        assert endpoint is not None
        endpoint.in_flight += 1
        placed[key] = endpoint
    for key, endpoint in placed.items():
        endpoint.in_flight -= 1
        pool.pin(key, endpoint)
    return placed


def test_every_turn_of_a_conversation_goes_to_one_server_and_loads_stay_bounded() -> None:
    def scenario(new_pool: Callable[[], EndpointPool]) -> None:
        pool = new_pool()
        keys = [(f"line-{index}", sample) for index in range(300) for sample in range(2)]
        servers: dict[Key, set[str]] = {key: set() for key in keys}
        for _ in range(5):
            for key, endpoint in turn(pool, keys).items():
                servers[key].add(endpoint.url)
        assert all(len(urls) == 1 for urls in servers.values())
        loads = [sum(1 for urls in servers.values() if url in urls) for url in URLS]
        cap = math.ceil(LOAD_CAP * len(keys) / len(URLS))
        assert max(loads) <= cap and sum(loads) == len(keys)

    with_pool(scenario)


def test_a_server_going_down_moves_its_conversations_once() -> None:
    def scenario(new_pool: Callable[[], EndpointPool]) -> None:
        pool = new_pool()
        keys: list[Key] = [(f"line-{index}", 0) for index in range(400)]
        before = turn(pool, keys)
        down = pool.endpoints[1]
        down.up = False
        during = turn(pool, keys)
        again = turn(pool, keys)
        down.up = True  # back, with an empty cache
        back = turn(pool, keys)
        settled = turn(pool, keys)
        moved = {key for key in keys if during[key] is not before[key]}
        displaced = {key for key in keys if before[key] is down}
        # All of the lost server's conversations move, once; of the others only the few the load cap pushes off
        # a server that took the displaced ones.
        assert displaced and displaced <= moved and len(moved - displaced) <= len(keys) // 20
        assert all(again[key] is during[key] for key in keys)
        # Back, it takes only what the cap pushes off the others (what moved stays where its prefix now is),
        # and then nothing moves.
        returned = {key for key in keys if back[key] is not again[key]}
        assert all(back[key] is down for key in returned) and len(returned) < len(displaced)
        assert all(settled[key] is back[key] for key in keys)

    with_pool(scenario)


def test_another_worker_places_a_conversation_where_this_one_did() -> None:
    """Stolen or resumed work arrives at a worker that never saw the conversation: rendezvous ranks the servers
    the same way there, so (loads allowing) its next turn finds the server that holds its prefix."""

    def scenario(new_pool: Callable[[], EndpointPool]) -> None:
        first, second = new_pool(), new_pool()
        keys: list[Key] = [(f"line-{index}", 1) for index in range(100)]
        placed = {key: first.pick(key) for key in keys}  # one at a time: no load cap binds
        elsewhere: dict[Key, Any] = {key: second.pick(key) for key in keys}
        assert {key: e.url for key, e in placed.items() if e} == {key: e.url for key, e in elsewhere.items() if e}
        assert len({e.url for e in placed.values() if e}) == len(URLS)

    with_pool(scenario)


def test_a_full_server_sends_the_next_conversation_to_its_second_choice() -> None:
    def scenario(new_pool: Callable[[], EndpointPool]) -> None:
        pool = new_pool()
        key = ("line-7", 0)
        first = pool.pick(key)
        assert first is not None
        first.in_flight = 10  # the other three idle: the cap (ceil(1.2 * 11 / 4) = 4) binds
        second = pool.pick(key)
        assert second is not None and second is not first and second.in_flight == 0

    with_pool(scenario)


def test_new_conversations_filling_a_server_to_its_cap_do_not_push_its_own_off() -> None:
    def scenario(new_pool: Callable[[], EndpointPool]) -> None:
        pool = new_pool()
        key = ("line-3", 0)
        home = pool.pick(key)
        assert home is not None
        pool.pin(key, home)
        for endpoint in pool.endpoints:
            endpoint.in_flight = 4
        home.in_flight = 6  # mean (18 + 1) / 4 = 4.75: at the placement cap (ceil(1.2 x 4.75) = 6)
        # A new conversation that ranks this server first goes elsewhere,
        first_choice = next(k for k in ((f"new-{i}", 0) for i in range(100)) if ranks_first(k) == home.url)
        assert pool.pick(first_choice) is not home
        assert pool.pick(key) is home  # while the placed one keeps its cached history.
        home.in_flight = 8  # past 1.5 x the mean: it moves, to the least loaded
        moved = pool.pick(key)
        assert moved is not None and moved is not home and moved.in_flight == 4

    with_pool(scenario)
