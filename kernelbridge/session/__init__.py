"""The session layer: named, stateful sandboxes of one bridge, and what they record."""
