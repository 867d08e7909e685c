"""Best-only selection (``--filter-returns-best``, the chart's ``extender.filterReturnsBest``): of
the scored candidates, those of the best ``NodeScore.best_rank``. One function, which the HTTP
server's ``/filter`` (pods with and without devices) and the simulator's kube-scheduler model call,
so that what is simulated is what is served."""

from __future__ import annotations

from typing import Iterable, TypeVar

K = TypeVar("K")


def best_ranked(ranks: Iterable[tuple[K, tuple[int, float] | None]]) -> tuple[tuple[int, float] | None, list[K]]:
    """The best rank among ``(key, rank)`` pairs (``NodeScore.best_rank``: the 0-10 score, then
    the weighted mean of the components but fragmentation; None: not a candidate) and the keys
    that have it, in input order; ``(None, [])`` without a candidate."""
    pairs = [(k, r) for k, r in ranks if r is not None]
    top = max((r for _, r in pairs), default=None)
    return top, [k for k, r in pairs if r == top]
