"""Stop sequences on generated text, holding back any tail that could still become one.

A stop string can arrive split across tokens ("</" then "answer>"), so text that ends with a
proper prefix of a stop is held back until the next piece shows whether it completes the
stop (then it is dropped) or not (then it is released). Text from a stop on never leaves.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Filters one request's text stream; `push` returns what is safe to show now."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Add a piece; return the releasable text. Sets `stopped` once a stop completes.

        Any stop occurrence must start inside the pending text: everything released earlier
        was released because no stop could begin there.
        """
        if self.stopped or not text:
            return ""
        if not self._stops:
            return text
        pending = self._pending + text
        hits = [i for i in (pending.find(stop) for stop in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return pending[: min(hits)]
        hold = self._held_length(pending)
        self._pending = pending[len(pending) - hold :]
        return pending[: len(pending) - hold]

    def flush(self) -> str:
        """Release the held-back tail at the end of generation: it never became a stop."""
        tail, self._pending = self._pending, ""
        return "" if self.stopped else tail

    def _held_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
