"""`ddpdoctor preflight`: checks of the cluster and the job's environment, run on every rank before a big job."""
