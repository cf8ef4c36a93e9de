"""The core model every layer shares: the words (``vocabulary``: causes, remedies, phases, devices, ...), what
was measured (``profile``: the RunProfile of a run, its ranks and steps, the one model shape) and what is wrong
with it (``findings``: a Finding, its Fix and the remedies it uses). Pure data: no torch, no I/O."""
