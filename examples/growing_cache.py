"""A growing-cache workload (long-running inference: KV caches that grow, mixed temporaries)
on hal's memory pool, with the pool's statistics along the way.

Eight sequences of different lengths each keep a cache that grows by one token per step: every
16 tokens it is reallocated larger, the old contents copied over and the old block freed; each
step also allocates and frees activations of mixed sizes. Every block size is different, so
the pool's cache fills with blocks of the wrong sizes: with a limit on what the pool may take
(``HAL_MEMORY_LIMIT``, 48M here unless set), an allocation then finds enough free memory in
total but no block that fits. The pool frees its cache and retries (``oom_retries``): the
workload keeps running. ``hal memory --json --run examples/growing_cache.py`` prints the
statistics afterwards. docs/memory.md explains the numbers.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HAL_MEMORY_LIMIT", "48M")  # read at the device's first allocation

import numpy as np

import hal

TOKEN_BYTES = 16 << 10  # one token of one sequence's cache
STEPS = 160
LENGTHS = [40, 160, 72, 120, 96, 56, 144, 88]  # tokens per sequence before it restarts


def main() -> None:
    """Run the workload on the first device; print the worst fragmentation seen and the final stats."""
    dev = hal.devices()[0]
    s = dev.create_stream()
    rng = np.random.default_rng(0)
    caches: list[hal.Buffer | None] = [None] * len(LENGTHS)
    tokens = [0] * len(LENGTHS)
    worst = {"fragmentation": 0.0, "largest_free_block": 0, "cached": 0}
    for _step in range(STEPS):
        for i, length in enumerate(LENGTHS):
            tokens[i] = tokens[i] + 1 if tokens[i] < length else 1
            old = caches[i]
            if old is None or tokens[i] * TOKEN_BYTES > old.nbytes:
                new = dev.alloc((tokens[i] + 15) // 16 * 16 * TOKEN_BYTES + 4096 * i, stream=s)
                if old is not None and tokens[i] > 1:
                    hal.copy(new, old, stream=s, nbytes=old.nbytes)
                if old is not None:
                    old.close()
                caches[i] = new
        for n in rng.integers(1 << 10, 2 << 20, size=6):  # activations of mixed sizes
            hal.memset(dev.alloc(int(n), stream=s), 0, stream=s)  # freed when collected
        st = dev.memory_stats()
        if st.get("fragmentation", 0.0) > worst["fragmentation"]:
            worst = {k: st[k] for k in worst}
    s.synchronize()
    st = dev.memory_stats()
    print(
        "growing cache: "
        + json.dumps(
            {
                "device": str(dev),
                "steps": STEPS,
                "limit": st.get("limit"),
                "worst": worst,
                "oom_retries": st.get("oom_retries"),
                "ooms": st.get("ooms"),
                "peak_reserved": st.get("peak_reserved"),
                "allocs": st.get("allocs"),
                "cache_hits": st.get("cache_hits"),
            }
        )
    )
    for c in caches:
        if c is not None:
            c.close()


if __name__ == "__main__":
    main()
