"""Tier 1 (seed 000 "Durable Data Log"): the logs the durable log writes to, on local files or objects."""
