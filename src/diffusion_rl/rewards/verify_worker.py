"""The process a :class:`~diffusion_rl.rewards.verify_pool.VerifyPool` worker runs: math-verify on the
golds and predictions its parent sends, one message per finished step.

Started by the pool as ``python -m diffusion_rl.rewards.verify_worker <fd>``, where ``<fd>`` is its end
of a socket pair. It lives apart from ``verify_pool.py`` because it needs ``math500``'s checks while
``math500`` needs the pool: kept together, the two modules would import each other.

The protocol, in order: the worker sends ``("ready",)`` once math-verify is warm; then for each
``(gold, predictions, timeout_s)`` it receives, ``("gold", parsed_ok)`` and one ``("pred", verdict)``
per prediction. It returns when the parent closes its end.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from diffusion_rl.rewards import math500


def worker_main(fd: int) -> None:
    """Parse golds and verify predictions sent over ``fd``, one message per finished step."""
    conn = Connection(fd)
    math500.warm_up()
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        gold, preds, timeout_s = msg
        ok = math500.parse_gold_cached(gold, timeout_s)
        conn.send(("gold", ok))
        for pred in preds:
            conn.send(("pred", ok and math500.verify_parsed(pred, gold, timeout_s)))


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
