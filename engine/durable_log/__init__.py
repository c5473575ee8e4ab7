"""The durable log (seed 000 "Durable Log"): operation processor, metadata updater, frames, memory log.

It owns the data-log interface (``data_log``) that the Tier 1 logs in ``engine/tier1/`` implement.
"""
