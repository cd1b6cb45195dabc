"""Build the generated parts of the docs: the timeline PNG of examples/sched_mixed.py.

    python docs/build.py [--trace TRACE.json] [--out docs/images/sched_mixed_timeline.png]

Runs the example (unless ``--trace`` names an existing trace), then draws its timeline with
matplotlib: one row per track (device streams, scheduler devices), slices coloured by
category (kernel, copy, collective, task). ``nox -s docs`` runs it with the ``docs``
extra installed; nothing else in the project needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COLOURS = {"kernel": "#4C78A8", "copy": "#F58518", "collective": "#54A24B", "task": "#B279A2"}


def render(trace: dict[str, Any], out: Path, title: str) -> None:
    """Draw ``trace`` (Chrome Trace Event JSON) as a PNG timeline at ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = trace["traceEvents"]
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    slices = [e for e in events if e.get("ph") == "X"]
    if not slices:
        raise SystemExit("the trace has no slices to draw")
    t0 = min(e["ts"] for e in slices)
    tracks = sorted({(e["pid"], e["tid"]) for e in slices}, key=lambda k: names.get(k, str(k)))
    row = {k: i for i, k in enumerate(tracks)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(tracks) + 1.5))
    for e in slices:
        k = (e["pid"], e["tid"])
        start, width = (e["ts"] - t0) / 1e3, max(e.get("dur", 0.0) / 1e3, 0.05)
        colour = COLOURS.get(e.get("cat", ""), "#999999")
        ax.broken_barh(
            [(start, width)],
            (row[k] - 0.4, 0.8),
            facecolors=colour,
            edgecolor="white",
            linewidth=0.3,
        )
        if e.get("cat") == "task" and width > 0.03 * (ax.get_xlim()[1] or 1):
            ax.text(
                start + width / 2,
                row[k],
                e["name"],
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([names.get(k, f"{k[0]}/{k[1]}") for k in tracks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first event")
    ax.set_title(title, fontsize=10)
    ax.legend(
        handles=[Patch(color=c, label=n) for n, c in COLOURS.items()], loc="lower right", fontsize=7
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the example if needed and render its timeline."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--trace", type=Path, help="an existing trace (default: run examples/sched_mixed.py)"
    )
    p.add_argument(
        "--out", type=Path, default=ROOT / "docs" / "images" / "sched_mixed_timeline.png"
    )
    args = p.parse_args(argv)
    trace_path = args.trace
    if trace_path is None:
        tmp = Path(tempfile.mkdtemp(prefix="hal-docs-"))
        trace_path = tmp / "sched_mixed_trace.json"
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "sched_mixed.py"), str(trace_path)],
            cwd=tmp,
            check=True,
        )
    data = json.loads(trace_path.read_text())
    render(
        data,
        args.out,
        "examples/sched_mixed.py: one training step on a mixed cpu/opencl pool (hal.sched, HAL_TRACE)",
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
