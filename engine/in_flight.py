"""What the steps launched and not yet committed hold of one sequence, and how the latest row is taken back.

Every step is in flight between its schedule and its commit (the scheduler folds in at schedule time what the
step will do whatever it samples: its tokens count as cached, a sampling row appends a placeholder token). In
the synchronous step loop a sequence has at most one row in flight and nothing is taken back, but for a step
that could not be launched. The overlapped loop (engine/step_loop.py) schedules the next step before this one
commits, so a sequence may have a second row in flight, scheduled before an EOS it samples now was known (or
before an abort): that row is taken back at once (`take_back`: its cached tokens and prefix-cache hashes; its
placeholder is dropped) and its token dropped when its step commits (`discard`). Everything here is the overlapped
loop's
bookkeeping; the scheduler calls it at the moments it owns (fold, commit, finish, fail).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class InFlight:
    rows: int = 0             # launched, uncommitted steps with a row for this sequence
    discard: int = 0          # of those, rows whose tokens are dropped at commit (it stopped or was aborted since)
    sample_row: int = -1      # its sampling row in the latest of them (the next step reads that token on the device)
    cached_before: int = 0    # num_cached_tokens before the latest of them was scheduled
    hashed_before: int = 0    # num_hashed_blocks before it
    hash_undo: list = field(default_factory=list)  # (block, hash, the block that hash led to before) since then

    def open_row(self, seq) -> None:
        """`seq` gets a row in the step being scheduled: remember what taking it back restores."""
        self.cached_before, self.hashed_before = seq.num_cached_tokens, seq.num_hashed_blocks
        self.hash_undo = []
        self.rows += 1


def take_back(seq, block_manager) -> None:
    """Undo what the latest row of `seq` folded in as cached: its tokens and the prefix-cache hashes registered
    since it was scheduled (that KV will never be used). Its placeholder tokens are the caller's to drop."""
    block_manager.unhash(seq, seq.flight.hashed_before)
    seq.num_cached_tokens = seq.flight.cached_before
