"""Part 4: the KV-cache lab."""
