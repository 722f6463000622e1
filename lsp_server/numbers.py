"""Small number helpers shared by the server's statistics, the storm and the benchmark.

One definition of a percentile for every report, so that `ditto/stats`, the storm and
`ditto-lsp bench` agree on what "p95" means.
"""

from __future__ import annotations

import math
from typing import Iterable


def percentile(values: Iterable[float], q: float, ndigits: int | None = None) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of `values`, None for no values;
    rounded to `ndigits` when given."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    v = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return v if ndigits is None else round(v, ndigits)
