"""Test support shared by several test folders: the fault-injection TCP proxy and its fixtures."""
