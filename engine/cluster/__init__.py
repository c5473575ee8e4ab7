"""Running containers on several nodes: leases in the bucket (docs/cluster.md)."""
