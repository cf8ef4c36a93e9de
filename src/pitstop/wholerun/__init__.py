"""Whole-run analysis: cut a long step series into windows, diagnose each with the doctor's rules, and report
what changed and what stalls periodically. Pure: no torch, no measuring, no printing."""
