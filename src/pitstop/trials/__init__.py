"""Trials: what runs inside a job that `pitstop tune` starts — the request it was given, the patches that
apply the requested remedies without editing the job, and the report each process writes back."""
