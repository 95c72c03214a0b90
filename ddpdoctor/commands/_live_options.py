"""The live-watch options of `ddpdoctor run` (--metrics-addr, --capture-on-slowdown) and the LiveWatch they make (click lives in commands/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ddpdoctor.errors import BadInput


def live_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--capture-on-slowdown", "capture_on_slowdown", type=float, default=None, metavar="SECONDS",
                      help="When slowdown or slow-rank fires, profile 5 iterations of every rank automatically "
                           "(RUN/captures/auto-*), at most once per SECONDS. Off by default.")(fn)
    fn = click.option("--metrics-addr", default=None, metavar="HOST:PORT",
                      help="Serve the live figures in Prometheus format on http://HOST:PORT/metrics "
                           "(bind 127.0.0.1 unless others must scrape it). Off by default.")(fn)
    return fn


# kwargs: click's parsed options of the command, as click hands them over (a boundary: the user's own flags)
def pop_live(kwargs: dict[str, Any]) -> Any:
    """The LiveWatch of the options `live_options` added to ``kwargs`` (BadInput for values that cannot work)."""
    from ddpdoctor.live.watch import LiveWatch

    addr = kwargs.pop("metrics_addr")
    every = kwargs.pop("capture_on_slowdown")
    if every is not None and not every >= 0:
        raise BadInput(f"--capture-on-slowdown must be a number of seconds >= 0, not {every}")
    return LiveWatch(capture_on_slowdown_s=every, metrics_addr=addr)


def node_name(spec: Any) -> str:
    """This launcher's name in RUN/live: node<N> (torchrun's --node-rank), rank<R> under --launcher none."""
    if spec.launcher == "none":
        from ddpdoctor.probes.config import rank_from_env

        return f"rank{rank_from_env()[0]}"
    for key in ("--node-rank", "--node_rank"):
        value = str(spec.torchrun.get(key, ""))
        if value.isdigit():
            return f"node{int(value)}"
    return "node0"
