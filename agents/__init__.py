"""dse package."""
