"""Types that cross a boundary: event envelope, health evidence and reports, operator policy."""
