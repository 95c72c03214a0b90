"""topo's EFA and OFI rules are linear in a line's length (issue 40 item 8: 2.0 / 8.2 / 35.0 CPU s at 1x / 2x / 4x
a line of repeated "efa"), and say what the `X.*Y` patterns they replace said."""

from __future__ import annotations

import random
import re
import time

from ddpdoctor.topo import evidence

OLD_OFI = re.compile(r"NET/OFI (?:Using|Initializing|Selected Provider|Setting)|aws-ofi-nccl|Loaded net plugin "
                     r"\S*(?:OFI|ofi|Libfabric)|NET/Plugin: Loaded .*ofi", re.IGNORECASE)
OLD_EFA = re.compile(r"(?:efa|EFA).*(?:No (?:EFA )?devices? (?:found|available)|no device|not found|Unable to find"
                     r"|fi_getinfo\S* (?:call )?failed)|No eligible providers|Couldn't find any optimal provider"
                     r"|OFI fi_getinfo\(\) call failed|Unable to find a protocol that worked|efa_device.*: No such "
                     r"device|Could not find any EFA devices", re.IGNORECASE)
WORDS = ["efa", "EFA", "efa_device", ": No such device", "fi_getinfo", "fi_getinfo()", " call ", "failed", " ", "x",
         "No devices found", "no device", "not found", "Unable to find", "No eligible providers", "NET/OFI Using",
         "aws-ofi-nccl", "Loaded net plugin ", "OFI", "ofi", "Libfabric", "NET/Plugin: Loaded ", "libfabric",
         "Could not find any EFA devices", "\t"]


def test_same_answers_as_the_patterns_they_replace() -> None:
    rng = random.Random(40)
    for _ in range(20_000):
        line = "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        assert evidence.efa_nodev(line) == bool(OLD_EFA.search(line)), line
        assert evidence.ofi_loaded(line) == bool(OLD_OFI.search(line)), line


def test_a_long_line_of_repeated_efa_is_read_in_linear_time() -> None:
    # 80,000 repetitions: about a minute of CPU for each of the old patterns (quadratic), milliseconds now. The
    # bound is 200x what it takes here, far above any load.
    for unit in ("efa ", "efa_device x ", "efa fi_getinfoX ", "ofi NET/Plugin: Loaded "):
        line = " nccl " + unit * 80_000
        t = time.process_time()
        evidence.scan(evidence.Evidence(), line)
        assert time.process_time() - t < 10.0, unit
