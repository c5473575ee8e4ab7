"""The durable log (seed 000 "Durable Log") and its Tier 1 implementations."""
