"""The four parts: their checks, reference code and case data."""
