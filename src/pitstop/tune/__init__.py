"""`pitstop tune`: try the diagnosed fixes on the user's own job, one short window each, and keep what
measurably helps."""
