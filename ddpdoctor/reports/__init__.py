"""One assembly per command: loaded artefacts -> analyses -> findings -> a Report of typed sections.

Where things go (docs/json.md stays the contract):
- ``reports/sections.py``: the typed sections (one dataclass per JSON section) and, per command, the sections its
  report may hold (``COMMAND_SECTIONS``, used to load a saved report back typed: ``load_report``).
- ``reports/<command>.py``: the command's one assembly function. It reads the run directory through ``rundir/``'s
  loaders, calls the pure analyses and the rules (``findings/``), and returns the finished Report. It prints
  nothing and writes nothing; the command (``commands/``) saves it and hands it to a renderer.

A new command (``diff``, ``tune`` ...) adds its report in three steps:
1. its section(s) in ``reports/sections.py``: a frozen dataclass subclassing ``Section`` with ``KEYS`` (its
   top-level JSON keys, in output order) and one field per key; override ``to_json``/``from_json`` only where a
   field is itself typed (see ``JobSection``). Add ``"command": (TheSection, ...)`` to ``COMMAND_SECTIONS``.
2. ``reports/<command>.py`` with ``assemble(...) -> Report`` building ``Report("<command>", parts=[...],
   findings=..., notes=...)`` in one go: nothing edits a Report after its assembly returns it.
3. its finding ids in ``findings/catalog.py`` and docs/findings.md, its keys in docs/json.md; its terminal view in
   ``renderers/`` choosing the section by type (``report.section(TheSection)``).
"""
