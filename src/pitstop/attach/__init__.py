"""``pitstop attach PID``: a running job, diagnosed without a restart. Where the job runs Python 3.14+ with
remote debugging on, pitstop's own probe is armed in it for one window by ``sys.remote_exec`` (``remote``,
``probed``, ``inject``); elsewhere its stacks are sampled from outside (py-spy, non-blocking: ``sampler``) and
turned into the same RunProfile the rules read."""
