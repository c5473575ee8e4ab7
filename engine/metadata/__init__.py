"""Container metadata (seed 000 "Segment Container Metadata", "Log Operations").

Container and segment metadata with its checkpoints, the log operations that change it, and the
attribute update verbs (seed 001) those operations carry.
"""
