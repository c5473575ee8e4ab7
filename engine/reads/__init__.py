"""The read path (seed 000 "Read Index", "Cache"): read index, cache, Tier 2 reads, read-ahead."""
