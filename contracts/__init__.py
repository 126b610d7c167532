"""Types that cross a boundary: event envelope, health evidence and reports, operator policy,
the root error tree; and the product's release, which every part reports."""

__version__ = "0.1.0"
