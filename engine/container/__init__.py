"""A segment container (seed 000 "Segment Containers"): its requests, lifecycle and state."""
