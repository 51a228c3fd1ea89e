"""The sandbox: limits, worker accounts, private views, process control."""
