"""How a measuring process's OpenMP threads wait: passively (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose.

torch's CPU kernels run on OpenMP threads (libgomp), which by default spin between parallel regions. On a machine
whose cores are shared (another process, CI neighbours, a host slower than its core count says) a spinning thread
burns the time slice the thread doing the work needs: on 2 cores with other processes busy, 12 training steps of
`tiny` took 181 s wall and 23 s CPU spinning, 32 s and 4.3 s waiting passively (issue 31). Both sides of an
interleaved timing pass run under the same policy, so ratios keep their meaning; exact memory and FLOP counts do
not depend on it. libgomp reads the variable once, when torch is imported: set it before that, or it does nothing
(``prefer_passive_openmp`` says whether it took effect).
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY = "OMP_WAIT_POLICY"


def prefer_passive_openmp() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process and the ones it starts (xdist workers, torchrun ranks),
    unless the environment already names a policy. True when the policy in force is passive for torch: set (or
    already passive) before torch was imported."""
    if WAIT_POLICY not in os.environ and "torch" not in sys.modules:
        os.environ[WAIT_POLICY] = "PASSIVE"
    return os.environ.get(WAIT_POLICY, "").upper() == "PASSIVE" and "torch" not in sys.modules
