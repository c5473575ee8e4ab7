"""Segment attributes (seed 001): the container's attributes and their index (a B+Tree) in Tier 2."""
