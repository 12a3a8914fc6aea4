"""Progress bars for long runs (the bench's calls and sweep, train.evaluate)."""
from __future__ import annotations

import sys


def progress_bar(label: str):
    """A labelled tqdm bar over an iterable, kept when done; none when stderr is not a terminal (a
    redirected log gets no carriage-return clutter) or tqdm is missing."""
    def wrap(iterable):
        if not sys.stderr.isatty():
            return iterable
        try:
            from tqdm import tqdm
        except ImportError:
            return iterable
        return tqdm(iterable, desc=label, file=sys.stderr, leave=True)
    return wrap
