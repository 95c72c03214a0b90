"""Live watch of a running job: per-rank step health, alerts, status, captures on demand, exporters."""
