"""The pytest plugin, the acceptance session and the `handover` command: what ties the inventory,
the runners, the suites and the reports together."""
