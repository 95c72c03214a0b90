"""The TensorBoard plugin class (entry point `tensorboard_plugins: ddpdoctor`): its HTTP routes and frontend."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from ddpdoctor.errors import BadInput
from ddpdoctor.tensorboard_plugin import access
from ddpdoctor.tensorboard_plugin import runs as runs_mod

PLUGIN_NAME = "ddpdoctor"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def _static(name: str) -> bytes:
    return resources.files("ddpdoctor.tensorboard_plugin").joinpath("static").joinpath(name).read_bytes()


def _json(request: Any, data: Any, code: int = 200) -> Any:
    return http_util.Respond(request, json.dumps(data, default=str, allow_nan=False), "application/json", code=code)


class DdpdoctorPlugin(base_plugin.TBPlugin):
    """The "ddpdoctor" tab: the run directories under the log dir, each one's report, and a timeline."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._logdir = Path(context.logdir) if context.logdir else None
        # (run, report.json mtime, ranks asked) -> timeline, the last one
        self._timelines: dict[tuple[str, float, tuple[int, ...]], Any] = {}

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="ddpdoctor", disable_reload=True)

    def is_active(self) -> bool:
        return bool(self._runs())

    def get_plugin_apps(self) -> dict[str, Callable[..., Any]]:  # route -> WSGI application
        app = wrappers.Request.application
        return {"/index.js": app(self._serve_js), "/runs": app(self._serve_runs), "/report": app(self._serve_report),
                "/report.json": app(self._serve_report_json), "/timeline": app(self._serve_timeline)}

    def _runs(self) -> dict[str, Path]:
        return runs_mod.find_runs(self._logdir) if self._logdir else {}

    def _visible_rows(self, request: Any) -> list[runs_mod.RunRow]:
        """The rows of the runs this request may see: private ones only by the user who started TensorBoard, runs
        readable by everyone by anyone (tensorboard_plugin/access.py), each checked and read through one handle."""
        if self._logdir is None:
            return []
        viewer = access.peer_uid(request.environ)
        rows = []
        for name in self._runs():
            with access.opened_run(self._logdir, name, viewer) as path:
                if path is not None:
                    rows.append(runs_mod.run_summary(name, path))
        return rows

    @contextlib.contextmanager
    def _run(self, request: Any) -> Iterator[tuple[str, Path] | None]:
        """The run a request names, only if it is one of the runs it may see (never a path from the URL), as a
        path through the folder's open descriptor: what was checked is what is read."""
        name = request.args.get("run", "")
        if self._logdir is None or name not in self._runs():
            yield None
            return
        with access.opened_run(self._logdir, name, access.peer_uid(request.environ)) as path:
            yield (name, path) if path is not None else None

    def _serve_js(self, request: wrappers.Request) -> wrappers.Response:
        return http_util.Respond(request, _static("index.js"), "application/javascript")

    def _serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        return _json(request, {"logdir": str(self._logdir or ""),
                               "runs": self._visible_rows(request)})

    def _serve_report_json(self, request: wrappers.Request) -> wrappers.Response:
        with self._run(request) as found:
            return self._report_json(request, found)

    def _report_json(self, request: wrappers.Request, found: tuple[str, Path] | None) -> wrappers.Response:
        if found is None:
            return _json(request, {"error": "no such run"}, 404)
        try:
            data = runs_mod.read_report_bytes(found[1])
        except BadInput as exc:
            return _json(request, {"error": exc.problem}, 404)
        return http_util.Respond(request, data, "application/json")

    def _serve_report(self, request: wrappers.Request) -> wrappers.Response:
        """The run's HTML report (the same page as RUN/report.html), with TensorBoard's CSP allowing its own
        inline scripts by hash and nothing else."""
        with self._run(request) as found:
            return self._report(request, found)

    def _report(self, request: wrappers.Request, found: tuple[str, Path] | None) -> wrappers.Response:
        from ddpdoctor.renderers.diff_html import render_report_html

        if found is None:
            return http_util.Respond(request, "no such run", "text/plain", code=404)
        try:
            page = render_report_html(runs_mod.load_report(found[1]))
        except (OSError, ValueError) as exc:
            return http_util.Respond(request, f"report.json unreadable: {exc}", "text/plain", code=422)
        hashes = [base64.b64encode(hashlib.sha256(m.group(1).encode("utf-8")).digest()).decode("ascii")
                  for m in _INLINE_SCRIPT.finditer(page)]
        return http_util.Respond(request, page, "text/html", csp_scripts_sha256s=hashes)

    def _serve_timeline(self, request: wrappers.Request) -> wrappers.Response:
        with self._run(request) as found:
            return self._timeline(request, found)

    def _timeline(self, request: wrappers.Request, found: tuple[str, Path] | None) -> wrappers.Response:
        if found is None:
            return _json(request, {"error": "no such run"}, 404)
        name, path = found
        try:
            ranks = runs_mod.parse_ranks(request.args.get("ranks", ""))
        except ValueError as exc:
            return _json(request, {"error": f"ranks: {exc}"}, 400)
        key = (name, (path / "report.json").lstat().st_mtime, tuple(ranks))
        if key not in self._timelines:
            try:
                data = runs_mod.timeline(path, ranks or None)
            except Exception as exc:  # noqa: BLE001 - a bad trace is shown in the tab, not a server error
                return _json(request, {"error": str(exc)}, 422)
            self._timelines = {key: data}  # one run kept: timelines of big runs are large
        return _json(request, self._timelines[key])
