"""What the monitor and the ranks agree on for captures (torch-free: the monitor must not import torch)."""

from __future__ import annotations

import re

CAPTURE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_STEPS = 100  # iterations of one capture window
WINDOW_KINDS = ("profile", "check-sync")  # captures the ranks run; "stacks" the monitor takes itself
