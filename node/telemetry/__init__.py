"""What a node reports about itself: metrics lines on disk and in trackers, and the live terminal view.

* ``metrics``  -- JSONL metrics that survive crashes (and a full disk); the live terminal view
* ``trackers`` -- optional TensorBoard / W&B (offline) / trackio reporting under TRL's metric names

Layers, top to bottom: ``trackers`` -> ``metrics``. No torch.
"""

from node.telemetry.metrics import JsonlWriter, LiveView, read_jsonl, truncate_after_step
from node.telemetry.trackers import TrackedMetrics, open_metrics, open_trackers

__all__ = [
    "JsonlWriter",
    "LiveView",
    "TrackedMetrics",
    "open_metrics",
    "open_trackers",
    "read_jsonl",
    "truncate_after_step",
]
