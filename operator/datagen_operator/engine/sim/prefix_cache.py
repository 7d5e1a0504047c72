"""SGLang's radix cache (`mem_cache/radix_cache.py` `RadixCache`, 0.5.23) for `meta_info.cached_tokens`.

The same tree: nodes hold page-aligned token runs and are split where a match or an insert diverges inside one;
a request's matched prefix is locked while it runs; a finished request inserts its prompt and output tokens
(`release_kv_cache` -> `checkpoint`: `origin_input_ids + output_ids` up to the KV it holds, which lacks the last
sampled token, with the output split off as its own leaf); eviction drops least-recently-used unlocked leaves, a parent once its last child is gone, until
the token pool fits. The pool (`max_total_num_tokens`) holds the tree and what running requests own beside it
(their uncached prompt tokens, booked at admission; their output joins the tree at finish). SGLang stamps nodes
with `time.monotonic()`: a walk stamps its whole path with one time and a node it creates a later one, which the
logical clock here reproduces (tests/contract/test_radix_cache.py holds both to the same sequences).
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

Tokens = Sequence[int]


class _Node:
    __slots__ = ("children", "id", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: array[int], parent: _Node | None, stamp: int, node_id: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[object, _Node] = {}
        self.lock_ref = 0
        self.last_access = stamp
        self.id = node_id


def _common_prefix(a: Tokens, a_start: int, b: Tokens, limit: int) -> int:
    """How many tokens a[a_start:] and b[:limit] share, by slice compares (C speed; as SGLang's gallop): the whole
    run first (the common case: a walk down a stored path), then halving."""
    if a[a_start : a_start + limit] == b[:limit]:
        return limit
    low, high = 0, limit - 1
    while low < high:
        middle = (low + high + 1) // 2
        if a[a_start + low : a_start + middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass
class Hold:
    """A running request's share of the cache: its cached prefix (locked) and the pool tokens it owns beside it."""

    cached: int
    node: _Node
    booked: int


class RadixCache:
    def __init__(self, capacity: int, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.capacity = capacity
        self.page_size = page_size
        self._clock = itertools.count(1)
        self._ids = itertools.count(1)
        self.booked = 0
        """Pool tokens running requests own outside the tree."""
        self.reset()

    # -- SGLang's tree operations ------------------------------------------------------------------
    def reset(self) -> None:
        self.root = _Node(array("I"), None, 0, 0)
        self.root.lock_ref = 1
        self.total_size = 0
        self.evictable_size = 0
        self._leaves: set[_Node] = set()
        self._heap: list[tuple[int, int, _Node]] = []

    def _child_key(self, key: Tokens, start: int) -> object:
        return key[start] if self.page_size == 1 else tuple(key[start : start + self.page_size])

    def _aligned(self, length: int) -> int:
        return length // self.page_size * self.page_size

    def _split(self, child: _Node, split_len: int) -> _Node:
        """`_split_node`: a new parent holds child's first split_len tokens, with child's locks."""
        assert child.parent is not None
        parent = child.parent
        new = _Node(child.key[:split_len], parent, next(self._clock), next(self._ids))
        new.lock_ref = child.lock_ref
        new.children = {self._child_key(child.key, split_len): child}
        parent.children[self._child_key(child.key, 0)] = new
        child.key = child.key[split_len:]
        child.parent = new
        return new

    def match(self, tokens: Tokens, limit: int | None = None) -> tuple[int, _Node]:
        """`match_prefix` of tokens[:limit], page-aligned: (matched length, last node). Touches the path."""
        if not isinstance(tokens, array) or tokens.typecode != "I":
            tokens = array("I", tokens)  # slices compare equal only between arrays of one type
        end = self._aligned(min(len(tokens), len(tokens) if limit is None else limit))
        node = self.root
        stamp = next(self._clock)
        node.last_access = stamp
        matched = 0
        while matched < end:
            child = node.children.get(self._child_key(tokens, matched))
            if child is None:
                break
            child.last_access = stamp
            self._touched(child)
            shared = self._aligned(_common_prefix(tokens, matched, child.key, min(len(child.key), end - matched)))
            if shared < len(child.key):
                node = self._split(child, shared)
                matched += shared
                break
            node = child
            matched += shared
        return matched, node

    def insert(self, tokens: Tokens) -> int:
        """`insert` of the page-aligned tokens: returns how many were already in the tree."""
        key = array("I", tokens[: self._aligned(len(tokens))])
        node = self.root
        stamp = next(self._clock)
        node.last_access = stamp
        done = 0
        while done < len(key):
            child = node.children.get(self._child_key(key, done))
            if child is None:
                break
            child.last_access = stamp
            self._touched(child)
            shared = self._aligned(_common_prefix(key, done, child.key, min(len(child.key), len(key) - done)))
            done += shared
            node = self._split(child, shared) if shared < len(child.key) else child
        if done < len(key):
            leaf = _Node(key[done:], node, next(self._clock), next(self._ids))
            node.children[self._child_key(key, done)] = leaf
            self.total_size += len(leaf.key)
            self.evictable_size += len(leaf.key)
            self._update_leaf_status(node)
            self._update_leaf_status(leaf)
        return done

    def lock(self, node: _Node) -> None:
        """`inc_lock_ref`: the path up from node cannot be evicted."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: _Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
            node.lock_ref -= 1
            self._update_leaf_status(node)
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Drop least-recently-used evictable leaves (then parents left childless) until num_tokens are freed."""
        evicted = 0
        while evicted < num_tokens and self._heap:
            stamp, _, leaf = heapq.heappop(self._heap)
            if leaf not in self._leaves or leaf.last_access != stamp:
                continue  # stale: touched since it was pushed, or no longer an evictable leaf
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(leaf.key, 0)]
            self._leaves.discard(leaf)
            self.total_size -= len(leaf.key)
            self.evictable_size -= len(leaf.key)
            evicted += len(leaf.key)
            self._update_leaf_status(parent)
        return evicted

    def _touched(self, node: _Node) -> None:
        if node in self._leaves:
            heapq.heappush(self._heap, (node.last_access, node.id, node))

    def _update_leaf_status(self, node: _Node) -> None:
        if node is self.root or node.lock_ref > 0 or node.children:
            self._leaves.discard(node)
        elif node not in self._leaves:
            self._leaves.add(node)
            heapq.heappush(self._heap, (node.last_access, node.id, node))
        if len(self._heap) > 4 * len(self._leaves) + 1024:  # drop stale entries now and then
            self._heap = [(n.last_access, n.id, n) for n in self._leaves]
            heapq.heapify(self._heap)

    # -- a request's life, as the scheduler drives the tree ------------------------------------------
    def admit(self, prompt: Tokens) -> Hold:
        """Prefill: match at most len-1 tokens (the last is always computed), lock them, book the rest of the
        prompt in the pool (evicting to make room). `cached` is what `meta_info.cached_tokens` reports."""
        cached, node = self.match(prompt, max(len(prompt) - 1, 0))
        self.lock(node)
        booked = len(prompt) - cached
        self.booked += booked
        self._fit()
        return Hold(cached, node, booked)

    def finish(self, hold: Hold, prompt: Tokens, output_ids: Tokens) -> None:
        """`release_kv_cache` -> `checkpoint`: insert prompt + output minus the last sampled token (its KV was
        never computed); insert the prompt again so the output is a leaf of its own (evictable without the
        prompt); match the whole key (which stamps the path); unlock."""
        self.booked -= hold.booked
        tokens = array("I", prompt)
        if isinstance(output_ids, array) and output_ids.typecode == "I":
            tokens.frombytes(memoryview(output_ids)[:-1].tobytes())  # an array's bytes: no int per token
        else:
            tokens.extend(output_ids[:-1])
        self.insert(tokens)
        if 0 < self._aligned(len(prompt)) < self._aligned(len(tokens)):
            self.insert(prompt)
        self.match(tokens)
        self.unlock(hold.node)
        self._fit()

    def _fit(self) -> None:
        over = self.total_size + self.booked - self.capacity
        if over > 0:
            self.evict(over)

    def flush(self) -> None:
        """`/flush_cache`: SGLang refuses while requests run; the simulator empties what is not locked."""
        self.evict(self.total_size)
