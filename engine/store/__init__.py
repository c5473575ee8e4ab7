"""The front door (seed 000 "Segment Containers"): SegmentStore, the containers it hosts, its record.

Also what spans containers or nodes (``cross_container``, ``cluster_wide``), the data folder, and
the tiers the store builds for its containers (``tiers``).
"""
