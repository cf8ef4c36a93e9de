"""``pitstop attach PID``: a running job, sampled from outside (py-spy, non-blocking), turned into the same
RunProfile the rules read. The sampler is one module (``sampler.py``) behind a small interface, so a PEP 768
remote-exec path (the full probe armed in the running process) can be added beside it."""
