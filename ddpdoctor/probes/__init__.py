"""Probes: code that runs inside the user's ranks. They only record, cheaply, into the run directory."""
