"""The NCCL_DEBUG=INFO line grammar (NCCL 2.4-2.30) as regular expressions; nccl_log.py applies them."""

from __future__ import annotations

import re

# host:pid:tid [cudaDev] [file:line [(func)]] NCCL LEVEL msg ; found anywhere in the line, so launcher prefixes
# ([rank3]:, [default0]:, [1,3]<stdout>:, "> ", CloudWatch "| ts |", WARN timestamps) need no list of their own.
_NCCL = re.compile(
    r"(?<![^\s:\[\]|])(?P<host>[^\s:\[\]|]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:[\d.]+ )?"
    r"(?:(?P<src>[\w./+-]+:\d+)(?: \(\w+\))? )?NCCL (?P<level>INFO|WARN|TRACE)\b ?(?P<msg>.*)$"
)
# The same line with "host:pid:tid" elided (people trim it when pasting): "[1] NCCL INFO ..." or "NCCL INFO ...".
_NCCL_NO_HOST = re.compile(
    r"(?:^|\s)(?:\[(?P<dev>\d+)\] )?(?:(?P<src>[\w./+-]+:\d+) )?NCCL (?P<level>INFO|WARN)\b ?(?P<msg>.*)$"
)
UNKNOWN_HOST = "(host not printed)"
_LAUNCHER_RANK = re.compile(r"^\s*(?:\[(?:rank|default)?(\d+)\]:?\s|\[(?:rank|default)(\d+)\]:|\[\d+,(\d+)\]<std\w+>:)")
_BARE_VERSION = re.compile(r"(?:^|[\s:>|])NCCL version (\d+\.\d+\.\d+\S*)")
_TESTS_RANK = re.compile(
    r"#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([0-9a-fA-Fx:.]+)\]\s*(.*)$"
)

_ENV = re.compile(r"^(NCCL_\w+) set by environment to (.*?)\s*$")
_ENV_SET = re.compile(r"^(NCCL_SOCKET_IFNAME|NCCL_IB_HCA) set to (\S+)")
# Searched token by token (nccl_log._ifaces): the address part may hold ':' (IPv6), so one search over a long line
# of "a:a:a:..." would rescan the rest of the line from every ':'.
_IFACES = re.compile(r"(?:\[\d+\])?([^\s:\[\];]+):([^\s<;]+)<\d+>")
_IFACE_TOKENS = re.compile(r"[\s;]+")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using(.*)$")
_SOCKET = re.compile(r"^NET/Socket ?: Using (?!\d+ threads)(.*)$")
_IB_USING = re.compile(r"^NET/IB ?: Using(.*?)(?:;\s*OOB .*)?$")
_IB_DEV = re.compile(r"\[\d+\]\s?([\w.-]+):(\d+)/(IB|RoCE|UNSPECIFIED)")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_GDR_HCA = re.compile(r"^NET/(\w+) ?: GPU Direct RDMA (Enabled|Disabled) for HCA \d+ '([^']*)'")
_GDR_RING = re.compile(r"Connected all rings, use ring PXN \d+ GDR (\d)")
_INIT = re.compile(
    r"comm \S+ rank (\d+) nranks (\d+) cudaDev (\d+)(?: nvmlDev \d+)? busId ([0-9a-fA-F]+)"
)
_COMM = re.compile(r"comm \S+ rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_RING_LIST = re.compile(r"^Channel (\d+)(?:/(\d+))? ?:((?:\s+\d+)+)\s*$")
_CONN = re.compile(
    r"^(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)(?:\[[0-9a-fA-F]+\])? -> (\d+)(?:\[[0-9a-fA-F]+\])?"
    r"(?: \[(send|receive)\])? via (\S+(?: pointer| shared memory)?)"
)
_CHANNELS = re.compile(
    r"^(\d+) coll channels, (?:(\d+) collnet channels, )?(?:(\d+) nvls channels, )?\d+ p2p channels"
)
_NVLS = re.compile(r"NVLS multicast support is (not )?available on dev (\d+)")
_P2P_OFF = re.compile(r"Could not enable P2P between dev|P2P is disabled between")
_RDMA_ERR = re.compile(
    r"ibv_modify_qp failed|Got completion (?:from peer \S+ )?with (?:error|status)|NET/IB ?: .*(?:failed|error)",
    re.IGNORECASE,
)
_ALGO_IGNORED = re.compile(
    r"ignoring NCCL_(?:ALGO|PROTO)|is not supported.*NCCL_ALGO|no algorithm/protocol available.*NCCL_(?:ALGO|PROTO)",
    re.IGNORECASE,
)
_PLUGIN_PATH = re.compile(r"^Plugin Path : (\S+)")
_P2P_PLUGIN = re.compile(r"^P2P plugin (?:v\d+ )?(\w+)")
_PLUGIN_LOADED = re.compile(r"^NET/Plugin ?: Loaded net plugin (\S+)|^(?:Initialized|Assigned) NET plugin (\S+)")
_PLUGIN_FAILED = re.compile(r"^Failed to initialize NET plugin (\S+)|^NET/OFI .*(?:[Ff]ailed|[Uu]nable|[Cc]ouldn't|No NICs)")
_OFI = re.compile(r"^NET/OFI\b")
_TOPO_PRINT = re.compile(r"\+ (NVL|PCI|NET|SYS)\[[\d.]+\] - (\w+)/")
_DRIVER = re.compile(r"^cudaDriverVersion (\d+)")
_INTERNAL_NETS = {"IB", "Socket"}
_MAX_LINE = 8192
