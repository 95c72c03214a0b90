"""What the monitor and the ranks agree on for captures (torch-free: the monitor must not import torch)."""

from __future__ import annotations

import re

CAPTURE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_PROFILE_STEPS = 100
