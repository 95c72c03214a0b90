"""The job-wide layer: every node's ranks as one job (state records, job rules, stack classes, the job store)."""
