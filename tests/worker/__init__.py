"""The worker's wire protocol."""
