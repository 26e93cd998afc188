"""Static token trees for speculative decoding (EAGLE-2/3 style, fixed shape).

Node 0 is the root: the pending token (chosen by the target, not yet in its cache). Every other node
is a path of child ranks from the root: (0,) is the draft's best token after the root, (1,) its
second best, (0, 2) the third best after (0,), ... Nodes are numbered by depth, then by path, so each
depth is a contiguous id range and parents come before children.

The target verifies all nodes in one pass: node i sits at cache slot P + i (P = the root's slot),
has rotary position P + depth(i) and sees the committed prefix [0, P) plus its ancestors and itself
(``tree_mask``). A chain of k tokens is the tree ((0,), (0, 0), ...).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property

import torch

# Probability that the target's token is the draft's rank-r token (r = 0, 1, ...): the default for
# ``TreeShape.best`` when a draft file carries no measured values ("rank_accept" in its metadata).
DEFAULT_RANK_ACCEPT = (0.6, 0.1, 0.04, 0.02)
MAX_RANK = 16


@dataclass(frozen=True)
class TreeShape:
    paths: tuple[tuple[int, ...], ...]  # one per non-root node: child ranks from the root

    def __post_init__(self) -> None:
        paths = tuple(tuple(p) for p in self.paths)
        if not paths:
            raise ValueError("a tree needs at least one node besides the root")
        for p in paths:
            if not p or any(not isinstance(r, int) or not 0 <= r < MAX_RANK for r in p):
                raise ValueError(f"tree path {p!r} must be a non-empty tuple of ranks in [0, {MAX_RANK})")
            if len(p) > 1 and p[:-1] not in paths:
                raise ValueError(f"tree path {p!r} has no parent {p[:-1]!r} in the tree")
        if len(set(paths)) != len(paths):
            raise ValueError(f"tree paths must be distinct, got {paths!r}")
        object.__setattr__(self, "paths", tuple(sorted(paths, key=lambda p: (len(p), p))))

    @classmethod
    def chain(cls, k: int) -> "TreeShape":
        """k draft tokens in a row (each the draft's best)."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (draft tokens per step) must be a positive integer, got {k!r}")
        return cls(tuple((0,) * d for d in range(1, k + 1)))

    @classmethod
    def best(cls, nodes: int, rank_accept=DEFAULT_RANK_ACCEPT, max_depth: int = 6) -> "TreeShape":
        """The ``nodes`` paths most likely to be accepted when, at depth d, the draft's rank-r token is
        the target's with probability rank_accept[d][r] (a flat tuple: the same at every depth; depths
        past the last row use the last), independently (best-first search, as EAGLE / Medusa pick)."""
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        table = tuple(tuple(max(a, 1e-6) for a in row) for row in _rank_table(rank_accept))  # 0: still usable
        heap = [(-a, (r,)) for r, a in enumerate(table[0])]
        heapq.heapify(heap)
        out = []
        while heap and len(out) < nodes:
            neg, path = heapq.heappop(heap)
            out.append(path)
            if len(path) < max_depth:
                row = table[min(len(path), len(table) - 1)]
                for r, a in enumerate(row):
                    heapq.heappush(heap, (neg * a, path + (r,)))
        return cls(tuple(out))

    # ---- derived structure (node 0 = root) -------------------------------------------------------
    @property
    def size(self) -> int:
        """Drafted nodes (the root excluded)."""
        return len(self.paths)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        return (0,) + tuple(len(p) for p in self.paths)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return (-1,) + tuple(index.get(p[:-1], 0) for p in self.paths)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        return (0,) + tuple(p[-1] for p in self.paths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Per node, its children ordered by rank."""
        kids = [[] for _ in range(self.size + 1)]
        for i in range(1, self.size + 1):
            kids[self.parents[i]].append(i)
        return tuple(tuple(sorted(k, key=lambda i: self.ranks[i])) for k in kids)

    @property
    def depth(self) -> int:
        return self.depths[-1]

    @cached_property
    def levels(self) -> tuple[range, ...]:
        """Node ids of each depth 1..depth (contiguous)."""
        return tuple(range(self.depths.index(d), len(self.depths) - self.depths[::-1].index(d))
                     for d in range(1, self.depth + 1))

    @property
    def is_chain(self) -> bool:
        return all(len(k) <= 1 for k in self.children)

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """bool [m + 1, m + 1]: [i, j] when node j is node i or one of its ancestors."""
        n = self.size + 1
        a = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            a[i] |= a[self.parents[i]]
        return a

    def path_to(self, node: int) -> list[int]:
        """Node ids from the root's first child down to ``node`` (empty for the root)."""
        out = []
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def expected_length(self, rank_accept=DEFAULT_RANK_ACCEPT) -> float:
        """Expected tokens committed per target pass under the ``best`` model (1 + the nodes' path odds)."""
        table = _rank_table(rank_accept)
        total = 1.0
        for p in self.paths:
            odds = 1.0
            for d, r in enumerate(p):
                row = table[min(d, len(table) - 1)]
                odds *= row[r] if r < len(row) else 0.0
            total += odds
        return total

    def describe(self) -> str:
        widths = [len(lv) for lv in self.levels]
        return f"{self.size} nodes, depth {self.depth}, per depth {widths}"


def _rank_table(rank_accept) -> tuple[tuple[float, ...], ...]:
    """A flat tuple of per-rank probabilities or one per depth -> one row per depth."""
    rows = rank_accept if rank_accept and isinstance(rank_accept[0], (tuple, list)) else [rank_accept]
    table = tuple(tuple(float(a) for a in row) for row in rows)
    if not table or any(not row or len(row) > MAX_RANK or any(not 0 <= a <= 1 for a in row) for row in table):
        raise ValueError(f"rank_accept must hold probabilities in [0, 1] for at most {MAX_RANK} ranks, "
                         f"got {rank_accept!r}")
    return table


def tree_mask(tree: TreeShape, prefix: int) -> torch.Tensor:
    """Target mask for verifying the tree at slots [prefix, prefix + m + 1): bool [1, m + 1, prefix + m + 1].

    Each node sees slots [0, prefix) and its ancestors and itself among the tree slots."""
    n = tree.size + 1
    past = torch.ones(n, prefix, dtype=torch.bool)
    return torch.cat([past, tree.ancestors], dim=1)[None]


def tree_positions(tree: TreeShape, prefix: int) -> torch.Tensor:
    """Rotary positions of the nodes (root at ``prefix``): [m + 1] i64."""
    return prefix + torch.tensor(tree.depths, dtype=torch.long)
