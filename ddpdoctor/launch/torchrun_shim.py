"""torchrun as ddpdoctor starts it: `python -m ddpdoctor.launch.torchrun_shim ARGS` is torchrun ARGS, except that
the TCP stores it hosts (the c10d rendezvous store and the workers' store) listen only where ddpdoctor says.

$DDPDOCTOR_STORE_BIND names the address: 127.0.0.1 for a single-node job (nothing off this host needs them), the
endpoint's own IP address for a multi-node job whose endpoint is a literal address; unset, torchrun's own
behaviour (every interface). torchrun's TCPStore has no bind-address option, but it accepts a socket already
bound and listening (master_listen_fd): the shim binds that socket."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

BIND_ENV = "DDPDOCTOR_STORE_BIND"


def bind_stores(address: str) -> None:
    """Make every TCPStore server created in this process listen on ``address`` only."""
    import torch.distributed as dist

    base = dist.TCPStore

    class BoundTCPStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                     *args: Any, **kwargs: Any) -> None:
            if is_master and kwargs.get("master_listen_fd") is None and len(args) < 4:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, int(port)))
                sock.listen(4096)
                port = sock.getsockname()[1]
                kwargs["master_listen_fd"] = sock.detach()  # the store owns the descriptor from here on
                kwargs.setdefault("use_libuv", True)  # the libuv server takes a listening fd; the legacy one does not
            super().__init__(host_name, port, world_size, is_master, *args, **kwargs)

    dist.TCPStore = BoundTCPStore  # type: ignore[misc]


def main() -> None:
    address = os.environ.pop(BIND_ENV, "")
    if address:
        bind_stores(address)
    from torch.distributed.run import (
        main as torchrun_main,  # imported after the patch: it binds TCPStore by name
    )

    sys.argv[0] = "torchrun"
    torchrun_main()


if __name__ == "__main__":
    main()
